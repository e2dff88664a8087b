//! A lease grant can be answered late: kept behind a slow member or a partition (with a
//! request timeout longer than the TTL, or retried after a timeout). The session counts
//! the lease's deadline from when the grant was sent, so a late answer leaves less of the
//! TTL (or none) to the first renewal. A lock taken then must still be held and renewed,
//! not come out lost: a late grant is renewed at once, one answered too late to be renewed
//! in time is revoked and granted again, and a lock without renewal still gets its whole
//! TTL.

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{address, locker_through, namespace, within};

/// A lock taken on a late grant, with what it needs to stay up.
struct Taken {
    _cluster: fencelock::testkit::EtcdCluster,
    /// The client's only path to etcd: dropped, it closes every connection.
    _proxy: FaultProxy,
    guard: fencelock::etcd::EtcdGuard,
    etcd_client: etcd_client::Client,
    /// When the kept grant went to etcd.
    delivered: Instant,
}

/// Takes lock "x" with `options` through a proxy that keeps the session's lease grant for
/// `kept` before it reaches etcd.
async fn lock_on_a_grant_kept_for(options: LockOptions, kept: Duration) -> Taken {
    let cluster = crate::support::etcd().await;
    let ns = namespace("late-grant");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    // Longer than what the grant is kept, so that the client waits for its answer.
    let client = locker_through(&proxy, &ns, Duration::from_secs(10)).await;
    proxy.hold_requests();
    let lock = client.lock("x", &options);
    tokio::pin!(lock);
    within(Duration::from_secs(10), "the grant is kept", async {
        tokio::select! {
            biased;
            outcome = &mut lock => panic!("answered while its grant is kept: {outcome:?}"),
            () = proxy.requests_held(1) => {}
        }
    })
    .await;
    // A client to look at etcd's leases, connected before the grant goes on.
    let etcd_client = cluster.client().await.expect("client");
    // The fault is the time itself: the grant stays unanswered this long.
    tokio::time::sleep(kept).await;
    // What was kept goes to etcd now, in order, and the rest flows again.
    let delivered = Instant::now();
    proxy.resume();
    let guard = within(Duration::from_secs(10), "the lock call", lock)
        .await
        .expect("a lock on a late grant");
    Taken {
        _cluster: cluster,
        _proxy: proxy,
        guard,
        etcd_client,
        delivered,
    }
}

/// The ids of the leases etcd has.
async fn leases(client: &mut etcd_client::Client) -> Vec<i64> {
    let leases = client.leases().await.expect("leases");
    leases.leases().iter().map(|l| l.id()).collect()
}

/// The guard stays held for `longer` (more than what was left of its lease's first
/// deadline), then is released.
async fn stays_held(guard: fencelock::etcd::EtcdGuard, longer: Duration) {
    assert!(guard.is_held(), "lost at once");
    tokio::select! {
        reason = guard.lost() => panic!("the lock was lost: {reason:?}"),
        () = tokio::time::sleep(longer) => {}
    }
    assert!(guard.is_held());
    crate::support::released(guard.release().await);
}

/// 6 s TTL, 4.5 s of it gone before the answer: 1.5 s left, enough to confirm a renewal
/// (which waits at most 667 ms for its answer) but not to wait for the usual first one,
/// a third of the TTL (2 s) after the grant.
const TTL: Duration = Duration::from_secs(6);
const KEPT: Duration = Duration::from_millis(4_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_late_is_renewed_before_its_deadline() {
    let mut taken = lock_on_a_grant_kept_for(LockOptions::new().with_ttl(TTL), KEPT).await;
    // The late lease itself is used (not granted again): only it exists.
    let lease = taken.guard.lease_id();
    assert_eq!(leases(&mut taken.etcd_client).await, [lease]);
    stays_held(taken.guard, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_renewal_on_a_late_grant_gets_its_whole_ttl() {
    let options = LockOptions::new().with_ttl(TTL).with_renewal(false);
    let taken = lock_on_a_grant_kept_for(options, KEPT).await;
    let left = taken.guard.lease_remaining().expect("a lease");
    // Its TTL counts from a renewal confirmed at its grant (usually the first renewal,
    // sent at once; the one made as renewal stops if that one failed).
    assert!(left > TTL * 2 / 3, "only {left:?} of a {TTL:?} TTL");
    crate::support::released(taken.guard.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_after_its_ttl_is_revoked_and_granted_again() {
    let ttl = Duration::from_secs(2);
    let Taken {
        _cluster,
        _proxy,
        guard,
        mut etcd_client,
        delivered,
    } = lock_on_a_grant_kept_for(
        LockOptions::new().with_ttl(ttl),
        Duration::from_millis(2_300),
    )
    .await;
    let lease = guard.lease_id();
    // Only the guard's lease is left, and sooner than the late one would expire on its
    // own (its TTL counts on the server from when it was delivered): it was revoked.
    within(Duration::from_secs(10), "the late lease gone", async {
        while leases(&mut etcd_client).await != [lease] {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let gone_after = delivered.elapsed();
    assert!(
        gone_after < ttl,
        "the late lease went after {gone_after:?}: expired, not revoked"
    );
    stays_held(guard, Duration::from_millis(1_500)).await;
}
