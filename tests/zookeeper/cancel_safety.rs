//! A dropped or timed-out acquisition leaves no node in the queue, and neither does a
//! `try_lock` that found the lock held.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{admin, await_children, children, locker, namespace, shared};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_removes_its_node() {
    let cluster = shared();
    let ns = namespace("cancel");
    let (a, b) = (locker(cluster, &ns).await, locker(cluster, &ns).await);
    let admin = admin(cluster).await;
    let dir = format!("{ns}/job");
    let held = a.lock("job", &LockOptions::new()).await.expect("A locks");
    let holder = held.path().rsplit('/').next().expect("name").to_owned();

    // B queues up behind A; once its node is there, its acquisition is dropped.
    let waiting = tokio::spawn(async move {
        let _ = b.lock("job", &LockOptions::new()).await;
    });
    let queue = await_children(&admin, &dir, 2).await;
    assert!(queue.contains(&holder), "{queue:?}");
    waiting.abort();
    let _ = waiting.await;

    let left = await_children(&admin, &dir, 1).await;
    assert_eq!(left, [holder], "only the holder's node is left");
    assert!(held.is_held());
    let _ = held.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_and_a_missed_try_lock_leave_nothing() {
    let cluster = shared();
    let ns = namespace("cancel-timeout");
    let (a, b) = (locker(cluster, &ns).await, locker(cluster, &ns).await);
    let admin = admin(cluster).await;
    let dir = format!("{ns}/job");
    let held = a.lock("job", &LockOptions::new()).await.expect("A locks");

    let missed = b
        .try_lock("job", &LockOptions::new())
        .await
        .expect("try_lock answers");
    assert!(missed.is_none(), "the lock is held");
    // Removed before try_lock answered: no watch needed.
    assert_eq!(
        children(&admin, &dir).await.len(),
        1,
        "try_lock left its node"
    );

    let err = b
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_millis(300)),
        )
        .await
        .expect_err("held by A");
    assert!(err.is_wait_timeout(), "{err}");
    await_children(&admin, &dir, 1).await;
    let _ = held.release().await;
}
