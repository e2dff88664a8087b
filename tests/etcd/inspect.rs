//! `EtcdLocker::inspect`: a lock's holder and waiters in queue order, with tokens, leases
//! and roles; a semaphore's N holders; an election's leader and value; every lock of a
//! namespace; and a holder whose lease expired gone from the queue.

use std::time::Duration;

use etcd_client::PutOptions;
use fencelock::etcd::{Role, lock_prefix};
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, locker, namespace, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_waiters_in_queue_order() {
    let cluster = etcd().await;
    let ns = namespace("inspect");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let c = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("client");
    let mut joins = PrefixWatch::start(&mut admin, &lock_prefix(&ns, "report")).await;
    let options = LockOptions::new();

    assert!(
        a.inspect("report")
            .await
            .expect("inspect")
            .entries
            .is_empty()
    );
    let held = a.lock("report", &options).await.expect("lock");
    joins.next_put().await;
    let (b_options, c_options) = (options.clone(), options.clone());
    let second = tokio::spawn(async move { b.lock("report", &b_options).await });
    joins.next_put().await;
    let third = tokio::spawn(async move { c.lock("report", &c_options).await });
    joins.next_put().await;

    let state = a.inspect("report").await.expect("inspect");
    assert_eq!(state.name, "report");
    assert_eq!(state.entries.len(), 3, "{state:?}");
    let holder = &state.entries[0];
    assert!(holder.holds);
    assert_eq!(holder.key, held.key());
    assert_eq!(holder.token, held.token());
    assert_eq!(holder.lease_id, held.lease_id());
    assert_eq!(holder.role, Role::Lock);
    let remaining = holder.lease_remaining.expect("a live lease");
    assert!(remaining <= holder.lease_ttl.expect("granted TTL"));
    assert_eq!(state.holders().count(), 1);
    let waiters: Vec<_> = state.waiters().collect();
    assert_eq!(waiters.len(), 2);
    assert!(holder.token < waiters[0].token && waiters[0].token < waiters[1].token);
    assert!(holder.writes_since > waiters[0].writes_since);
    assert!(waiters[0].writes_since > waiters[1].writes_since);

    released(held.release().await);
    let next = within(Duration::from_secs(5), "second holder", second)
        .await
        .expect("task")
        .expect("lock");
    let state = a.inspect("report").await.expect("inspect");
    assert_eq!(state.entries.len(), 2);
    assert_eq!(state.entries[0].token, next.token());
    assert!(state.entries[0].holds && !state.entries[1].holds);
    released(next.release().await);
    released(
        within(Duration::from_secs(5), "third holder", third)
            .await
            .expect("task")
            .expect("lock")
            .release()
            .await,
    );
}

#[tokio::test]
async fn semaphores_elections_and_every_lock_of_a_namespace() {
    let cluster = etcd().await;
    let ns = namespace("inspect-all");
    let locks = locker(&cluster, &ns).await;
    let options = LockOptions::new();
    let semaphore = locks.semaphore("calls", 2).expect("semaphore");
    let first = semaphore.acquire(&options).await.expect("permit");
    let second = semaphore.acquire(&options).await.expect("permit");
    assert!(
        semaphore
            .try_acquire(&options)
            .await
            .expect("try")
            .is_none()
    );
    let election = locks.election("primary").expect("election");
    let leadership = election
        .campaign("host-a:8080", &options)
        .await
        .expect("campaign");

    let calls = locks.inspect("calls").await.expect("inspect");
    assert_eq!(calls.holders().count(), 2);
    assert!(
        calls
            .entries
            .iter()
            .all(|e| e.role == Role::Permit { permits: 2 })
    );
    let primary = locks.inspect("primary").await.expect("inspect");
    assert_eq!(primary.holders().count(), 1);
    assert_eq!(
        primary.entries[0].role,
        Role::Candidate {
            value: b"host-a:8080".to_vec()
        }
    );
    let all = locks.inspect_all().await.expect("inspect all");
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["calls", "primary"]);

    released(first.release().await);
    released(second.release().await);
    released(leadership.resign().await);
}

#[tokio::test]
async fn a_holder_whose_lease_expired_leaves_the_queue_to_the_next() {
    let cluster = etcd().await;
    let ns = namespace("inspect-expired");
    let locks = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("client");
    // A holder that died: its key under a 1 s lease nobody renews (as a crashed Go
    // client's would be).
    let lease = admin.lease_grant(1, None).await.expect("grant").id();
    let dead_key = format!("{}{lease:x}", lock_prefix(&ns, "job"));
    admin
        .put(
            dead_key.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");
    let state = locks.inspect("job").await.expect("inspect");
    assert_eq!(state.entries.len(), 1);
    assert!(state.entries[0].holds);
    assert_eq!(state.entries[0].lease_id, lease);
    assert!(state.entries[0].lease_remaining.expect("live") <= Duration::from_secs(1));

    let next = within(
        Duration::from_secs(5),
        "the lock after the lease expired",
        locks.lock("job", &LockOptions::new()),
    )
    .await
    .expect("lock");
    let state = locks.inspect("job").await.expect("inspect");
    assert_eq!(state.entries.len(), 1, "{state:?}");
    assert_eq!(state.entries[0].token, next.token());
    assert!(state.entries[0].holds);
    assert_ne!(state.entries[0].key, dead_key);
    released(next.release().await);
}
