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

/// What `inspect` says of a Redlock lock when the masters disagree (the review of
/// ad237fb): a copy whose renewal failed does not shorten how long the lock stays held
/// (a majority still holds it), and a holder seen on fewer than a quorum while the
/// masters that could not be read would make a majority is undecided, not "not held".
#[tokio::test]
async fn inspect_tells_a_held_lock_from_an_undecided_one() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let prefix = prefix("redlock-inspect");
    let config = RedisConfig::masters(masters.iter().map(RedisServer::url))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_millis(500));
    let locks = RedlockLocker::connect(config).await.expect("connect");
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_renewal(false);
    let guard = locks.lock("batch", &options).await.expect("lock");
    let key = format!("{prefix}:lock:batch");

    // One copy about to expire: the other two keep the lock for ~30 s.
    let mut first = masters[0].connection().await.expect("connection");
    let _: () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(1000)
        .query_async(&mut first)
        .await
        .expect("PEXPIRE");
    let state = locks.inspect("batch").await.expect("inspect");
    let holder = &state.holders[0];
    assert!(holder.quorum && !holder.undecided, "{state:?}");
    let remaining = holder.remaining.expect("expires");
    assert!(
        remaining > Duration::from_secs(20),
        "the majority's time: {remaining:?}"
    );

    // The copy gone, another master unreachable: one copy seen, the unreachable master
    // could hold the second.
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut first)
        .await
        .expect("DEL");
    masters[1].kill().expect("kill");
    let state = locks.inspect("batch").await.expect("inspect with 2 of 3");
    let holder = &state.holders[0];
    assert!(!holder.quorum && holder.undecided, "{state:?}");
    assert_eq!(holder.remaining, None, "no majority seen: {state:?}");
    assert!(guard.is_held(), "the holder itself still believes it holds");
}
