//! A client that holds many locks has a watch per lock on its one watch stream, and asks
//! for many at once: as a burst of grants ages past 100 ms, or all of them again when the
//! stream breaks. etcd answers each creation while the client is still sending the rest.
//! If the client reads nothing until it has sent them all, etcd's send loop blocks on the
//! full HTTP/2 window, its receive loop then stops reading requests, and the client's
//! sends wait for good: no deletion reaches a holder or a waiter of this client again
//! (`src/etcd/watch_stream.rs`). Both tests failed before the fix: the first never had its
//! 20,480 locks watched (60 s); in the second, whose watches were opened a few at a time,
//! the waiter was not granted within 30 s after the stream broke (a variant with 8,000
//! watches passed, one with 20,000 never told a holder of its deleted key).

use std::time::Duration;

use fencelock::etcd::{EtcdGuard, EtcdLocker};
use fencelock::testkit::{EtcdCluster, FaultProxy, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, MultiGuard};
use futures_util::StreamExt;

use crate::support::{
    PrefixWatch, address, etcd, locker, locker_through, namespace, released, within,
};

/// Locks held, each with a watch of its own: well past the 8,000 that still worked.
const HELD: usize = 320 * GROUP;
/// Locks taken together (the most `lock_all` takes).
const GROUP: usize = 64;

/// A long TTL: the session must outlive a break and a loaded machine's catch-up, so that
/// what the guards report is the deletion, not an expired lease.
fn options() -> LockOptions {
    LockOptions::new().with_ttl(Duration::from_secs(60))
}

/// Holds `HELD` locks, `GROUP` at a time with eight groups in flight: their watches are
/// asked for in bursts, as the grants age.
async fn hold_in_groups(locks: &EtcdLocker) -> Vec<MultiGuard<EtcdGuard>> {
    futures_util::stream::iter(0..HELD / GROUP)
        .map(|group| {
            let locks = locks.clone();
            async move {
                let names: Vec<String> = (0..GROUP).map(|i| format!("g{group}-{i}")).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                locks
                    .lock_all(&names, &options())
                    .await
                    .expect("lock a group")
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Holds `HELD` locks one at a time from 64 tasks: their watches are asked for a few at a
/// time.
async fn hold_one_by_one(locks: &EtcdLocker) -> Vec<EtcdGuard> {
    futures_util::stream::iter(0..HELD)
        .map(|i| {
            let locks = locks.clone();
            async move {
                locks
                    .lock(&format!("l{i}"), &options())
                    .await
                    .expect("lock")
            }
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Waits until etcd (this test's own) has at least `HELD` watchers: a holder's watch is
/// asked for once its grant has held 100 ms.
async fn all_watched(cluster: &EtcdCluster) {
    within(Duration::from_secs(60), "every held lock watched", async {
        loop {
            let metrics = cluster.metrics(0).await.expect("etcd metrics");
            #[allow(clippy::cast_precision_loss)]
            if metric_sum(&metrics, "etcd_debugging_mvcc_watcher_total", &[]) >= HELD as f64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Deletes `guard`'s key as an operator would and expects the guard to be told. A watch
/// asked for again from a past revision is caught up by etcd's loop for lagging watchers
/// (every 100 ms, at most 512 of them a pass in 3.4): seconds for all of them.
async fn delete_and_expect_loss(cluster: &EtcdCluster, guard: &EtcdGuard) {
    let mut client = cluster.client().await.expect("client");
    client.delete(guard.key(), None).await.expect("delete");
    let reason = within(
        Duration::from_secs(60),
        "the holder learns its key was deleted",
        guard.lost(),
    )
    .await;
    assert_eq!(reason, LossReason::KeyDeleted);
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_locks_taken_in_groups_are_all_watched() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("many-watches-groups")).await;
    let held = hold_in_groups(&locks).await;
    all_watched(&cluster).await;
    delete_and_expect_loss(&cluster, &held[HELD / GROUP / 2].guards()[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_twenty_thousand_watches_still_hears_deletions_after_its_stream_broke() {
    let cluster = etcd().await;
    let ns = namespace("many-watches-reopened");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let locks = locker_through(&proxy, &ns, Duration::from_secs(5)).await;
    let other = locker(&cluster, &ns).await;
    let held = hold_one_by_one(&locks).await;
    all_watched(&cluster).await;

    // Another client holds a lock this one will wait for.
    let first = other.lock("contended", &options()).await.expect("lock");
    let connections = proxy.connections_accepted();
    proxy.sever();
    proxy.heal();
    let mut client = cluster.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(&ns, "contended");
    let mut joins = PrefixWatch::start(&mut client, &prefix).await;
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("contended", &options()).await })
    };
    within(
        Duration::from_secs(30),
        "the waiter's join",
        joins.next_put(),
    )
    .await;
    // The join went through a new connection: the stream broke with the old one.
    assert!(proxy.connections_accepted() > connections);
    released(first.release().await);
    // The waiter's watch goes out after the 20,480 asked for again.
    let granted = within(
        Duration::from_secs(60),
        "the waiter is granted once the holder released",
        waiting,
    )
    .await
    .expect("task")
    .expect("granted");
    released(granted.release().await);
    delete_and_expect_loss(&cluster, &held[HELD / 2]).await;
}
