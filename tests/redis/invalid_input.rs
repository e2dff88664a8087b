//! Bad input to the Redis backends gets typed errors; an unreachable server fails within
//! the connect timeout.

use std::time::{Duration, Instant};

use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::testkit::free_port;
use fencelock::{LockBackend, LockError, LockOptions};

use crate::support::{locker, prefix, redis};

#[tokio::test]
async fn bad_names_options_and_settings_are_refused() {
    let server = redis().await;
    let locks = locker(&server, &prefix("invalid")).await;
    for name in ["", "a/b", "with space"] {
        let err = locks.lock(name, &LockOptions::new()).await.expect_err(name);
        assert!(matches!(err, LockError::InvalidName { .. }), "{err}");
    }
    for ttl in [Duration::ZERO, Duration::from_millis(50)] {
        let err = locks
            .try_lock("fine", &LockOptions::new().with_ttl(ttl))
            .await
            .expect_err("tiny ttl");
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    }
    let two = RedisConfig::masters([server.url(), server.url()]);
    let err = RedisLocker::connect(two).await.expect_err("one URL only");
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
    // One server twice (another database of it too): it would count twice toward the
    // quorum and grant alone. Before, this connected.
    let other = redis().await;
    let db1 = format!("{}1", server.url());
    for urls in [
        [server.url(), server.url(), other.url()],
        [server.url(), db1, other.url()],
    ] {
        let err = RedlockLocker::connect(RedisConfig::masters(urls))
            .await
            .expect_err("a master listed twice");
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
    }
    let err = RedlockLocker::connect(RedisConfig::new("not a url"))
        .await
        .expect_err("bad url");
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_fails_within_the_connect_timeout() {
    let port = free_port().expect("port");
    let config = RedisConfig::new(format!("redis://127.0.0.1:{port}/"))
        .with_connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = RedisLocker::connect(config)
        .await
        .expect_err("nothing listens there");
    assert!(err.is_unavailable(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}
