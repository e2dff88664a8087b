//! The Redis semaphore: never more than N holders, a full semaphore refuses `try_acquire`,
//! and a release lets a waiter in.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::{LockGuard, LockOptions};

use crate::support::{locker, prefix, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_holders_at_once() {
    const PERMITS: usize = 3;
    let server = redis().await;
    let prefix = prefix("semaphore");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let semaphore = locker(&server, &prefix)
            .await
            .semaphore("calls", PERMITS)
            .expect("semaphore");
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = semaphore
                    .acquire(&LockOptions::new())
                    .await
                    .expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                released(permit.release().await);
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(60), "all permits", task)
            .await
            .expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} holders at once");
    assert_eq!(
        most, PERMITS,
        "the semaphore should have been full at times"
    );
}

#[tokio::test]
async fn a_full_semaphore_refuses_and_a_release_admits_a_waiter() {
    let server = redis().await;
    let prefix = prefix("semaphore-full");
    let pool = locker(&server, &prefix)
        .await
        .semaphore("pool", 2)
        .expect("semaphore");
    let options = LockOptions::new();
    let a = pool.acquire(&options).await.expect("permit");
    let b = pool.acquire(&options).await.expect("permit");
    assert_ne!(a.key(), b.key(), "two different slots");
    assert!(b.token() > a.token());
    assert!(
        pool.try_acquire(&options).await.expect("try").is_none(),
        "full"
    );

    let waiter_pool = locker(&server, &prefix)
        .await
        .semaphore("pool", 2)
        .expect("semaphore");
    let waiter = tokio::spawn(async move { waiter_pool.acquire(&LockOptions::new()).await });
    let freed = a.key().to_owned();
    released(a.release().await);
    let c = within(Duration::from_secs(5), "waiter admitted", waiter)
        .await
        .expect("task")
        .expect("permit");
    assert_eq!(c.key(), freed, "the freed slot was taken");
    released(b.release().await);
    released(c.release().await);
}
