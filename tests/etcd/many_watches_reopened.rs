//! A client that holds many locks has a watch per lock on its one watch stream. When that
//! stream breaks, every watch is asked for again at once on a new one, and etcd answers
//! each creation while the client is still sending the rest. If the client reads nothing
//! until it has sent them all, etcd's send loop blocks on the full HTTP/2 window, its
//! receive loop then stops reading requests, and the client's sends wait for good: no
//! deletion reaches a holder or a waiter of this client again (`src/etcd/watch_stream.rs`).
//! Before the fix: with 20,480 watches, a waiter was never granted (and a holder never
//! told of its deleted key); with 8,000 it was.

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, FaultProxy, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, MultiGuard};
use futures_util::StreamExt;

use crate::support::{
    PrefixWatch, address, etcd, locker, locker_through, namespace, released, within,
};

/// Locks taken together, one transaction each (the most `lock_all` takes).
const GROUP: usize = 64;
/// Locks held, each with its own watch: well past the 8,000 that still worked before.
const HELD: usize = 320 * GROUP;

/// Holds `HELD` locks, `GROUP` at a time.
async fn hold_many(locks: &EtcdLocker) -> Vec<MultiGuard<fencelock::etcd::EtcdGuard>> {
    futures_util::stream::iter(0..HELD / GROUP)
        .map(|group| {
            let locks = locks.clone();
            async move {
                let names: Vec<String> = (0..GROUP).map(|i| format!("h{group}-{i}")).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                locks
                    .lock_all(&names, &LockOptions::new())
                    .await
                    .expect("lock a group")
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Waits until etcd has at least `count` watchers (a holder's watch is asked for once its
/// grant has held 100 ms).
async fn watchers(cluster: &EtcdCluster, count: usize) {
    within(Duration::from_secs(60), "every held lock watched", async {
        loop {
            let metrics = cluster.metrics(0).await.expect("etcd metrics");
            #[allow(clippy::cast_precision_loss)]
            if metric_sum(&metrics, "etcd_debugging_mvcc_watcher_total", &[]) >= count as f64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_twenty_thousand_watches_still_hears_deletions_after_its_stream_broke() {
    let cluster = etcd().await;
    let ns = namespace("many-watches");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let locks = locker_through(&proxy, &ns, Duration::from_secs(5)).await;
    let other = locker(&cluster, &ns).await;
    let held = hold_many(&locks).await;
    watchers(&cluster, HELD).await;

    // Another client holds a lock this one will wait for.
    let first = other
        .lock("contended", &LockOptions::new())
        .await
        .expect("lock");
    proxy.sever();
    proxy.heal();
    let mut client = cluster.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(&ns, "contended");
    let mut joins = PrefixWatch::start(&mut client, &prefix).await;
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("contended", &LockOptions::new()).await })
    };
    within(
        Duration::from_secs(30),
        "the waiter's join",
        joins.next_put(),
    )
    .await;
    released(first.release().await);
    let granted = within(
        Duration::from_secs(30),
        "the waiter is granted once the holder released",
        waiting,
    )
    .await
    .expect("task")
    .expect("granted");
    released(granted.release().await);

    // A holder whose key is deleted is told, once its reopened watch has caught up (etcd
    // syncs 512 lagging watchers per 100 ms: 4 s for all of them, more on a busy machine).
    let guard = &held[HELD / GROUP / 2].guards()[0];
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
