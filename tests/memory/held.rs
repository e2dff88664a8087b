//! Holding many etcd locks on one client, as `fencelock bench`'s renewal row does, and
//! what they cost on the heap ([`super::counting`]).

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, fetch_metrics, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions};

use super::counting::Live;

/// What `n` held locks cost, per lock: live heap blocks, bytes asked for, bytes of malloc
/// chunks.
pub struct PerLock {
    pub blocks: f64,
    pub bytes: f64,
    pub chunk_bytes: f64,
}

/// Takes `n` locks on one client (64 at a time, as the bench does), holds them until
/// every one has its watch (etcd counts them), and counts what grew on the heap: the
/// guards (in a vector, as a caller keeps them) and everything the client keeps for them.
/// What is made once per client (its session, its watch stream) is made before counting.
pub async fn etcd_locks(n: usize) -> PerLock {
    let etcd = EtcdCluster::builder().start().await.expect("start etcd");
    let locks = EtcdLocker::connect(etcd.config("held-memory"))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    locks.session(options.ttl()).await.expect("session");
    let warm = locks.lock("warm-up", &options).await.expect("warm-up lock");
    let _released = warm.release().await.expect("warm-up release");
    let before = Live::now();
    let mut guards = Vec::with_capacity(n);
    let mut pending = Vec::new();
    for i in 0..n {
        let (locks, options, name) = (locks.clone(), options.clone(), format!("held-{i}"));
        pending.push(tokio::spawn(
            async move { locks.lock(&name, &options).await },
        ));
        if pending.len() == 64 || i + 1 == n {
            for task in pending.drain(..) {
                guards.push(task.await.expect("task").expect("lock"));
            }
        }
    }
    // A holder opens its lock's watch once its grant has held 100 ms: wait until etcd
    // has them all (the warm-up lock's may linger too).
    let metrics = etcd.admin_endpoint(0);
    let watched = async {
        loop {
            let text = fetch_metrics(&metrics).await.expect("etcd metrics");
            #[allow(clippy::cast_precision_loss)]
            if metric_sum(&text, "etcd_debugging_mvcc_watcher_total", &[]) >= n as f64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), watched)
        .await
        .expect("every held lock watched within a minute");
    // Answers the client has not read yet (the watches' creation, on its one stream) are
    // on the heap for a moment more: the lowest of a second's samples is what stays.
    let mut least = Live::now();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Live::now();
        if now.chunk_bytes < least.chunk_bytes {
            least = now;
        }
    }
    let (blocks, bytes, chunk_bytes) = least.per(before, n);
    let held = guards.iter().filter(|g| g.is_held()).count();
    assert_eq!(held, n, "every lock still held when counted");
    for guard in guards {
        let _released = guard.release().await.expect("release");
    }
    PerLock {
        blocks,
        bytes,
        chunk_bytes,
    }
}
