//! A lease whose renewals were applied but never answered runs out by the client's clock
//! first: the server, which got those renewals, keeps the lease (and the lock key) for
//! up to one more renewal interval, plus its own expiry check. The client already told
//! its guards the lock is lost; it revokes the lease at once (best effort), so the lock
//! is free for the next waiter instead of blocked by a key nobody holds.

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};
use tokio::time::Instant;

use crate::support::{PrefixWatch, address, etcd, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_by_the_local_clock_is_revoked() {
    let cluster = etcd().await;
    let ns = namespace("local-expiry");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let client = fencelock::etcd::EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()]).with_namespace(&ns),
    )
    .await
    .expect("connect");
    let mut admin = cluster.client().await.expect("admin");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/x/")).await;
    let ttl = Duration::from_secs(3);
    let guard = client
        .lock("x", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock");
    let key = watch.next_put().await;

    // Requests go on reaching etcd, answers never come back: the next renewal is applied
    // (the server's deadline moves on) but the client's stays at its last confirmed one.
    proxy.hold_answers();
    let reason = within(ttl * 2, "the guard learns it is lost", guard.lost()).await;
    assert_eq!(reason, LossReason::Expired);
    let lost_at = Instant::now();
    assert!(!guard.is_held());

    // The server would keep the key until the later deadline (about a renewal interval,
    // 1 s, plus etcd's expiry check, up to 0.5 s); the client's revoke removes it now.
    within(
        Duration::from_secs(5),
        "the key is deleted",
        watch.deleted(&key),
    )
    .await;
    let after = lost_at.elapsed();
    assert!(
        after < Duration::from_millis(400),
        "the key outlived the local loss by {after:?}"
    );
    drop(guard);
}
