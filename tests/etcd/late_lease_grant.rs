//! A lease grant can be answered late: kept behind a slow member or a partition, with a
//! request timeout longer than the TTL. The session counts the lease's deadline from when
//! the grant was sent, so a late answer leaves less of the TTL (or none) to the first
//! renewal. A lock taken then must still be held and renewed, not come out lost: the first
//! renewal comes early enough, and a grant answered after its whole TTL is revoked and
//! granted again.

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{address, locker_through, namespace, within};

/// A lock taken on a late grant, with what it needs to stay up.
struct Taken {
    _cluster: fencelock::testkit::EtcdCluster,
    /// The client's only path to etcd: dropped, it closes every connection.
    _proxy: FaultProxy,
    guard: fencelock::etcd::EtcdGuard,
    etcd_client: etcd_client::Client,
}

/// Takes lock "x" with a TTL of `ttl` through a proxy that keeps the session's lease grant
/// for `kept` before it reaches etcd.
async fn lock_on_a_grant_kept_for(ttl: Duration, kept: Duration) -> Taken {
    let cluster = crate::support::etcd().await;
    let ns = namespace("late-grant");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    // Longer than what the grant is kept, so that the client waits for its answer.
    let client = locker_through(&proxy, &ns, Duration::from_secs(10)).await;
    let options = LockOptions::new().with_ttl(ttl);
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
    // The fault is the time itself: the grant stays unanswered this long.
    tokio::time::sleep(kept).await;
    // What was kept goes to etcd now, in order, and the rest flows again.
    proxy.resume();
    let guard = within(Duration::from_secs(10), "the lock call", lock)
        .await
        .expect("a lock on a late grant");
    let etcd_client = cluster.client().await.expect("client");
    Taken {
        _cluster: cluster,
        _proxy: proxy,
        guard,
        etcd_client,
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_late_is_renewed_before_its_deadline() {
    // 2.4 s of a 3 s TTL gone before the answer: the first renewal at a third of the TTL
    // (1 s after the answer) would come after the deadline.
    let taken =
        lock_on_a_grant_kept_for(Duration::from_secs(3), Duration::from_millis(2_400)).await;
    stays_held(taken.guard, Duration::from_millis(1_500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_after_its_ttl_is_revoked_and_granted_again() {
    let Taken {
        _cluster,
        _proxy,
        guard,
        mut etcd_client,
    } = lock_on_a_grant_kept_for(Duration::from_secs(1), Duration::from_millis(1_300)).await;
    let lease = guard.lease_id();
    // The late lease is revoked in the background: only the guard's is left.
    within(Duration::from_secs(10), "the late lease revoked", async {
        loop {
            let leases = etcd_client.leases().await.expect("leases");
            let ids: Vec<i64> = leases.leases().iter().map(|l| l.id()).collect();
            if ids == [lease] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stays_held(guard, Duration::from_millis(1_500)).await;
}
