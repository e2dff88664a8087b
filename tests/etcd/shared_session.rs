//! Two tasks sharing one client (one session, one lease) exclude each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, locker, namespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_one_session_exclude_each_other() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("shared")).await;
    let options = LockOptions::new();

    let first = locks.lock("report", &options).await.expect("lock");
    // Same client, same session: still refused while the first task holds it.
    assert!(
        locks
            .try_lock("report", &options)
            .await
            .expect("try_lock")
            .is_none()
    );
    let lease = first.lease_id();
    crate::support::released(first.release().await);

    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (locks, options) = (locks.clone(), options.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = locks.lock("report", &options).await.expect("lock");
                assert_eq!(guard.lease_id(), lease, "one session for the client");
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                crate::support::released(guard.release().await);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}
