//! Redis configuration the token needs (issue 21, item 6): a server that may evict keys
//! is refused at connect unless the user opts out, and a token counter that went
//! backwards (evicted, flushed) for a name this client has seen is detected and moved
//! forward, so that the rightful holder's token is never older than one already handed out.

use fencelock::redis::{RedisConfig, RedisLocker, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker, prefix, redis, released};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_keys_is_refused_unless_allowed() {
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server = RedisServer::start_with_args(&["--maxmemory-policy", policy])
            .await
            .expect("redis");
        let config = server.config(&prefix("evicting"));
        let err = RedisLocker::connect(config.clone())
            .await
            .expect_err("an evicting server is refused");
        assert!(err.is_unsafe_server(), "{policy}: {err:?}");
        let message = err.to_string();
        assert!(
            message.contains(policy) && message.contains("maxmemory-policy"),
            "{message}"
        );
        let locks = RedisLocker::connect(config.with_allow_eviction(true))
            .await
            .expect("accepted when the user allows eviction");
        let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
        released(guard.release().await);

        // Redlock: one evicting master is enough to refuse.
        let healthy = redis().await;
        let urls = vec![healthy.url(), server.url(), redis().await.url()];
        let err =
            RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix("evicting")))
                .await
                .expect_err("a Redlock set with an evicting master is refused");
        assert!(err.is_unsafe_server(), "{policy}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_counter_that_went_backwards_is_moved_forward() {
    let server = redis().await;
    let prefix = prefix("regression");
    let locks = locker(&server, &prefix).await;
    let mut last = None;
    for _ in 0..3 {
        let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
        last = Some(guard.token());
        released(guard.release().await);
    }
    let last = last.expect("three grants");
    // The counter is gone (FLUSHALL; eviction does the same): INCR restarts at 1.
    let mut conn = server.connection().await.expect("connect");
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut conn)
        .await
        .expect("FLUSHALL");
    let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
    assert!(
        guard.token() > last,
        "token {} after {last}: the counter went backwards and was handed out",
        guard.token()
    );
    released(guard.release().await);
    // The counter itself moved forward: other clients get newer tokens too.
    let other = locker(&server, &prefix).await;
    let guard = other.lock("job", &LockOptions::new()).await.expect("lock");
    assert!(guard.token() > last);
    released(guard.release().await);
}
