//! A lock without renewal gets its whole TTL from the grant, however long it queued.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_of_a_lock_without_renewal_counts_from_the_grant() {
    let cluster = etcd().await;
    let ns = namespace("ttl-from-grant");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/door/")).await;
    let ttl = Duration::from_secs(3);

    let held = a.lock("door", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new().with_ttl(ttl).with_renewal(false);
        b.lock("door", &options).await
    });
    let queued = watch.next_put().await;
    // The fault: the waiter queues for most of its TTL before the holder lets go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    crate::support::released(held.release().await);

    let guard = within(Duration::from_secs(5), "waiter granted", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert_eq!(guard.key(), queued);
    // Right after the grant, the server's lease and our local deadline both have (about)
    // the whole TTL left, not the second that was left of it when the wait ended.
    let lease = client
        .lease_time_to_live(guard.lease_id(), None)
        .await
        .expect("lease ttl");
    assert!(lease.ttl() >= 2, "server lease has {} s left", lease.ttl());
    let local = guard.lease_remaining().expect("etcd locks have a lease");
    assert!(
        local > Duration::from_secs(2),
        "local deadline {local:?} away"
    );
    assert!(guard.is_held());
}
