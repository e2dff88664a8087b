//! Redlock grants with a majority of masters and refuses without one.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{owner_part, prefix, released};

#[tokio::test]
async fn redlock_needs_a_majority_of_masters() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let prefix = prefix("redlock");
    let config = RedisConfig::masters(masters.iter().map(RedisServer::url))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_millis(500));
    let locks = RedlockLocker::connect(config).await.expect("connect");
    assert_eq!(locks.quorum(), 2);
    let options = LockOptions::new().with_ttl(Duration::from_secs(5));

    // All three up: granted, and the lock is on every master.
    let guard = locks.lock("batch", &options).await.expect("lock");
    for master in &masters {
        let stored = master
            .get(&format!("{prefix}:lock:batch"))
            .await
            .expect("get");
        assert_eq!(owner_part(stored.as_deref()), Some(guard.owner()));
    }
    // Held on a majority: a second client is refused.
    let other = RedlockLocker::connect(
        RedisConfig::masters(masters.iter().map(RedisServer::url)).with_prefix(&prefix),
    )
    .await
    .expect("connect");
    assert!(
        other
            .try_lock("batch", &options)
            .await
            .expect("try_lock")
            .is_none()
    );
    released(guard.release().await);

    // Two of three: still a majority.
    masters[0].kill().expect("kill");
    let guard = locks
        .lock("batch", &options)
        .await
        .expect("lock with 2 of 3");
    released(guard.release().await);

    // One of three: refused, and the partial grant on the survivor is undone.
    masters[1].kill().expect("kill");
    let err = locks
        .try_lock("batch", &options)
        .await
        .expect_err("no majority");
    assert!(err.is_unavailable(), "{err}");
    let leftover = masters[2]
        .get(&format!("{prefix}:lock:batch"))
        .await
        .expect("get");
    assert_eq!(leftover, None);
}
