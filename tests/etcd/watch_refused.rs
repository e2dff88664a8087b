//! A lock watch the server refuses (created and cancelled at once: here, permission to
//! read the lock's keys was taken away while a waiter waited) ends the wait with a typed
//! error at once, instead of a waiter that retries a refused watch in silence until its
//! wait timeout.

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockOptions};

use crate::support::{PrefixWatch, address, etcd, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_is_refused_gets_permission_denied() {
    let cluster = etcd().await;
    let ns = namespace("watch-refused");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "waiter").await;

    let holder = fencelock::etcd::EtcdLocker::connect(
        cluster.config(&ns).with_credentials("root", "rootpw"),
    )
    .await
    .expect("holder");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let waiter = crate::support::locker_as_through(&proxy, &ns, "waiter").await;
    let prefix = format!("{ns}/x/");
    let mut watch = PrefixWatch::start(&mut admin, &prefix).await;

    let held = holder.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let wait = LockOptions::new().with_wait_timeout(Duration::from_secs(20));
    let waiting = tokio::spawn(async move { waiter.lock("x", &wait).await.map(drop) });
    watch.next_put().await;

    // The waiter may no longer read the lock's keys; its watch breaks and is refused when
    // it is asked for again.
    crate::support::revoke_namespace(&mut admin, &ns).await;
    proxy.sever();
    proxy.heal();

    let err = within(Duration::from_secs(10), "the waiter is told", waiting)
        .await
        .expect("task")
        .expect_err("refused");
    assert!(err.is_permission_denied(), "{err}");
    crate::support::released(fencelock::LockGuard::release(held).await);
}
