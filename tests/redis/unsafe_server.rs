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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_lost_before_its_counter_moves_forward_gets_no_newer_token() {
    let server = redis().await;
    let prefix = prefix("regression-lost");
    let proxy = crate::support::proxy_to(&server).await;
    let slow = RedisLocker::connect(
        RedisConfig::new(format!("redis://{}/", proxy.address())).with_prefix(&prefix),
    )
    .await
    .expect("connect");
    let other = locker(&server, &prefix).await;
    let mut last = None;
    for _ in 0..3 {
        let guard = slow.lock("job", &LockOptions::new()).await.expect("lock");
        last = Some(guard.token());
        released(guard.release().await);
    }
    let last = last.expect("three grants");
    // The counter goes backwards; the slow client's next grant comes with token 1, and
    // moving the counter forward takes it one more round trip on a slow link.
    let mut conn = server.connection().await.expect("connect");
    let counter = format!("{prefix}:token:job");
    let key = format!("{prefix}:lock:job");
    redis::cmd("DEL")
        .arg(&counter)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEL");
    proxy.delay(std::time::Duration::from_millis(300));
    let taking = tokio::spawn(async move { slow.lock("job", &LockOptions::new()).await });
    // Its key lands; before the counter moves, the key goes (an operator, an expiry) and
    // another client takes the lock.
    crate::support::within(
        std::time::Duration::from_secs(5),
        "the slow grant lands",
        async {
            loop {
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("EXISTS");
                if exists {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEL");
    let live = other
        .try_lock("job", &LockOptions::new())
        .await
        .expect("try_lock")
        .expect("the lock is free");
    match taking.await.expect("task") {
        Ok(stale) => assert!(
            stale.token() < live.token(),
            "the lost grant got token {} above the live holder's {} (last seen {last})",
            stale.token(),
            live.token()
        ),
        Err(err) => assert!(err.is_lost(), "{err}"),
    }
    released(live.release().await);
}
