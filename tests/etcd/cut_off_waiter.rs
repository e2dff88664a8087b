//! A waiter cut off from etcd: its wait timeout still bounds the call, and its queue key
//! never outlives the partition (a key left behind would block the lock for as long as
//! the waiter's process lives, since its session lease is renewed).

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{PrefixWatch, address, etcd, keys, locker, locker_through, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_when_its_wait_times_out_leaves_no_key_once_the_link_heals() {
    let cluster = etcd().await;
    let ns = namespace("cut-waiter");
    let prefix = format!("{ns}/door/");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let holder = locker(&cluster, &ns).await;
    // Requests may take 3 s, longer than the whole wait: the wait timeout must bound it.
    let cut_off = locker_through(&proxy, &ns, Duration::from_secs(3)).await;
    let next = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &prefix).await;

    let held = holder
        .lock("door", &LockOptions::new())
        .await
        .expect("lock");
    watch.next_put().await;
    let started = Instant::now();
    // The waiter's process lives on (its locker, and so its session, stay).
    let waiter = cut_off.clone();
    let waiting = tokio::spawn(async move {
        // A lease that outlives the cut: only the removal can free the queue.
        let options = LockOptions::new()
            .with_ttl(Duration::from_secs(10))
            .with_wait_timeout(Duration::from_secs(1));
        waiter.lock("door", &options).await.map(drop)
    });
    let queued = watch.next_put().await;

    // The waiter is cut off while it waits; its wait timeout fires during the cut, so
    // the removal of its key cannot get through.
    proxy.cut();
    let err = within(Duration::from_secs(10), "wait ends", waiting)
        .await
        .expect("task")
        .expect_err("the lock is held");
    let returned = started.elapsed();
    assert!(err.is_wait_timeout(), "{err}");
    proxy.heal();

    // Once the link heals, the waiter's key goes, and the lock passes on promptly.
    crate::support::released(held.release().await);
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(4));
    let granted = next.lock("door", &options).await;
    let left = keys(&mut client, &prefix).await;
    assert!(
        !left.contains(&queued),
        "the cut-off waiter's key is still there: {left:?}"
    );
    let granted = granted.expect("the next client gets the lock");
    assert_eq!(left, vec![granted.key().to_owned()]);
    assert!(
        returned < Duration::from_millis(1500),
        "a 1 s wait returned after {returned:?}"
    );
    drop(cut_off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_bounds_opening_the_session_and_joining() {
    let cluster = etcd().await;
    let ns = namespace("cut-join");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    // Each request may take 3 s: longer than the whole wait.
    let cut_off = locker_through(&proxy, &ns, Duration::from_secs(3)).await;

    // Connected, but cut off before the first lock: the lease grant never gets through.
    proxy.cut();
    let started = Instant::now();
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(1));
    let err = within(
        Duration::from_secs(10),
        "lock returns",
        cut_off.lock("door", &options),
    )
    .await
    .expect_err("nothing gets through");
    let returned = started.elapsed();
    assert!(err.is_wait_timeout(), "{err}");
    assert!(
        returned < Duration::from_millis(1500),
        "a 1 s wait returned after {returned:?}"
    );
    proxy.heal();
}
