//! A 3-node cluster loses its leader to SIGKILL while a lock is held and another client
//! waits: the holder keeps the lock, the waiter gets it next, and tokens keep increasing.

use std::time::Duration;

use fencelock::testkit::SelectedEtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_leader_kill() {
    // Processes, or containers with FENCELOCK_HARNESS=containers (and the feature).
    let mut cluster = SelectedEtcdCluster::start(3).await.expect("cluster");
    let ns = namespace("failover");
    let config = cluster.config(&ns);
    let holder_locks = fencelock::etcd::EtcdLocker::connect(config.clone())
        .await
        .expect("connect");
    let waiter_locks = fencelock::etcd::EtcdLocker::connect(config)
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(5));

    let before = holder_locks.lock("job", &options).await.expect("lock");
    let t0 = before.token();
    assert_eq!(
        before.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let held = holder_locks.lock("job", &options).await.expect("lock");
    let t1 = held.token();
    assert!(t1 > t0);
    let waiter = {
        let options = options.clone();
        tokio::spawn(async move { waiter_locks.lock("job", &options).await })
    };

    let leader = cluster.leader().await.expect("leader");
    cluster.kill(leader).await.expect("kill leader");
    let new_leader = cluster.wait_for_leader().await.expect("new leader");
    assert_ne!(leader, new_leader);

    // The lease survived the election: the lock is still ours, and release says so.
    assert!(held.is_held());
    let released = within(Duration::from_secs(10), "release", held.release()).await;
    assert_eq!(released.expect("release"), ReleaseOutcome::Released);

    let next = within(Duration::from_secs(10), "waiter", waiter)
        .await
        .expect("task")
        .expect("waiter gets the lock");
    let t2 = next.token();
    assert!(t2 > t1, "token {t2} after {t1}");
    crate::support::released(next.release().await);

    let after = holder_locks.lock("job", &options).await.expect("lock");
    assert!(after.token() > t2);
    crate::support::released(after.release().await);
}
