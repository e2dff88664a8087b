//! Releasing a `lock_all` on etcd deletes every key in **one** transaction: one request and
//! one Raft proposal, counted by etcd itself, whatever the number of names (a release of
//! each guard on its own cost a proposal per name, or per batch of the session's group
//! commit). Every key is gone when it answers, every name is free for another client at
//! once (its tokens larger), and the client's own names are given back (its next
//! acquisition of them reuses them).

use std::time::Duration;

use fencelock::testkit::{EtcdCluster, metric_sum};
use fencelock::{LockGuard, LockOptions, try_lock_all};

use crate::support::{etcd, handled, keys, locker, namespace, released};

/// Proposals the member has applied (a single member: every write's one proposal).
async fn proposals(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    metric_sum(&metrics, "etcd_server_proposals_applied_total", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_three_locks_is_one_transaction_and_one_proposal() {
    released_in_one_proposal(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_eight_locks_is_one_transaction_and_one_proposal() {
    released_in_one_proposal(8).await;
}

async fn released_in_one_proposal(count: usize) {
    let cluster = etcd().await;
    let ns = namespace("release-all");
    let locks = locker(&cluster, &ns).await;
    let other = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("admin");
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let names: Vec<String> = (0..count).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let all = locks.lock_all(&names, &options).await.expect("lock_all");
    let held: Vec<String> = all.guards().iter().map(|g| g.key().to_owned()).collect();
    let token = all.token();

    let txns = handled(&cluster, "Txn").await;
    let deletes = handled(&cluster, "DeleteRange").await;
    let applied = proposals(&cluster).await;
    released(all.release().await);
    let txns = handled(&cluster, "Txn").await - txns;
    let deletes = handled(&cluster, "DeleteRange").await - deletes;
    let applied = proposals(&cluster).await - applied;
    assert_eq!(
        (txns, deletes, applied),
        (1.0, 0.0, 1.0),
        "(transactions, deletes, proposals) releasing {count} locks"
    );
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());

    // Every name is free for another client at once, its tokens larger.
    let next = try_lock_all(&other, &names, &options)
        .await
        .expect("try_lock_all")
        .expect("every name is free");
    let next_token = next.token();
    assert!(next_token > token);
    released(next.release().await);

    // The client's names were given back: its next acquisition of them reuses them.
    let again = locks.lock_all(&names, &options).await.expect("again");
    let reused: Vec<String> = again.guards().iter().map(|g| g.key().to_owned()).collect();
    assert_eq!(
        reused, held,
        "every name given back once its delete was confirmed"
    );
    assert!(again.token() > next_token);
    released(again.release().await);
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}
