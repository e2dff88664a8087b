//! The watchdog keeps a lock past its TTL while its owner lives; once the owner is gone
//! (its runtime torn down with no chance to release), the lock expires by its TTL.

use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker, owner_part, prefix, redis, released};

#[tokio::test]
async fn a_renewed_lock_outlives_its_ttl() {
    let server = redis().await;
    let locks = locker(&server, &prefix("watchdog")).await;
    let ttl = Duration::from_millis(300);
    let guard = locks
        .lock("long-job", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock");
    // Three TTLs pass: without renewal the key would be gone.
    tokio::time::sleep(ttl * 3).await;
    assert!(guard.is_held());
    let stored = server.get(guard.key()).await.expect("get");
    assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
    released(guard.release().await);
}

#[tokio::test]
async fn a_dead_owners_lock_expires_by_its_ttl() {
    let server = redis().await;
    let prefix = prefix("dead-owner");
    let ttl = Duration::from_millis(500);
    let config = server.config(&prefix);

    // The owner lives in a runtime of its own; tearing it down stops its renewal task
    // and closes its connections, as a killed process would.
    let owner = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let key = runtime.block_on(async {
            let locks = fencelock::redis::RedisLocker::connect(config)
                .await
                .expect("connect");
            let guard = locks
                .lock("cron", &LockOptions::new().with_ttl(ttl))
                .await
                .expect("lock");
            let key = guard.key().to_owned();
            std::mem::forget(guard); // never released
            key
        });
        runtime.shutdown_background();
        (key, Instant::now())
    });
    let (key, killed_at) = owner.await.expect("owner");
    assert!(
        server.get(&key).await.expect("get").is_some(),
        "still held right after death"
    );

    let waiter = locker(&server, &prefix).await;
    let guard = waiter
        .lock(
            "cron",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock frees itself");
    // Renewed at most a third of the TTL before the owner died, so it expired no sooner
    // than two thirds of the TTL after: it was not released, it ran out.
    assert!(
        killed_at.elapsed() >= ttl * 3 / 5,
        "freed after {:?}",
        killed_at.elapsed()
    );
    released(guard.release().await);
}
