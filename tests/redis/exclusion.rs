//! Many clients, one Redis lock: the read-yield-write race on a shared counter loses no
//! update, and no two holders overlap.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker, prefix, redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_redis_lock_excludes_concurrent_holders() {
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 10;
    let server = redis().await;
    let prefix = prefix("exclusion");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locks = locker(&server, &prefix).await;
        let (counter, inside, overlaps) = (counter.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locks
                    .lock("counter", &LockOptions::new())
                    .await
                    .expect("lock");
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let seen = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                crate::support::released(guard.release().await);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
}
