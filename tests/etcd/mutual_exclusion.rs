//! Many tasks, one lock: a read-yield-write race on a shared counter that only the lock
//! prevents. The same race without the lock loses updates, which shows the test can fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, locker, namespace};

const TASKS: u64 = 8;
const ROUNDS: u64 = 10;

/// One racy increment: read, let other tasks run, write back.
async fn racy_increment(counter: &AtomicU64, inside: &AtomicBool) -> bool {
    let overlapped = inside.swap(true, Ordering::SeqCst);
    let seen = counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    counter.store(seen + 1, Ordering::SeqCst);
    inside.store(false, Ordering::SeqCst);
    overlapped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_prevents_lost_updates() {
    let cluster = etcd().await;
    let ns = namespace("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        // Separate clients: separate sessions, as separate processes would have.
        let locks = locker(&cluster, &ns).await;
        let (counter, inside, overlaps, tokens) = (
            counter.clone(),
            inside.clone(),
            overlaps.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locks
                    .lock("counter", &LockOptions::new())
                    .await
                    .expect("lock");
                if racy_increment(&counter, &inside).await {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens.lock().expect("tokens").push(guard.token());
                crate::support::released(guard.release().await);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }

    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        counter.load(Ordering::SeqCst),
        TASKS * ROUNDS,
        "lost updates"
    );
    // Grants in the order they happened carry increasing tokens.
    let tokens: Vec<FencingToken> = tokens.lock().expect("tokens").clone();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Tasks sharing sessions: key names are reused within a session as soon as a release is
/// confirmed, while the other waiters follow deletions on one shared watch per lock. An
/// old deletion of a reused name must never cross out its new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_prevents_lost_updates_when_tasks_share_sessions() {
    let cluster = etcd().await;
    let ns = namespace("mutex-shared");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locks = locker(&cluster, &ns).await;
        for _ in 0..4 {
            let (locks, counter, inside, overlaps) = (
                locks.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..15 {
                    let guard = locks
                        .lock("counter", &LockOptions::new())
                        .await
                        .expect("lock");
                    if racy_increment(&counter, &inside).await {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    crate::support::released(guard.release().await);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(counter.load(Ordering::SeqCst), 2 * 4 * 15, "lost updates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_lock_the_same_race_loses_updates() {
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (counter, inside) = (counter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                racy_increment(&counter, &inside).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert!(counter.load(Ordering::SeqCst) < TASKS * ROUNDS);
}
