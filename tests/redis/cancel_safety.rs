//! An acquire abandoned while its request is in flight leaves no lock behind, even when
//! the request reaches the server after the caller gave up.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockOptions};

use crate::support::{prefix, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_in_flight_acquire_leaves_no_lock() {
    let server = redis().await;
    let prefix = prefix("abandoned");
    let address = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(address).await.expect("proxy");
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_secs(10));
    let a = RedisLocker::connect(config).await.expect("connect");
    let long = LockOptions::new().with_ttl(Duration::from_secs(60));

    // The request is written but held by the proxy; the caller gives up on it.
    proxy.pause();
    let abandoned = tokio::time::timeout(Duration::from_millis(300), a.lock("job", &long)).await;
    assert!(abandoned.is_err(), "the acquire cannot finish while paused");
    // Now it arrives and takes the lock for a minute; the cleanup queued behind it
    // must remove it again.
    proxy.resume();

    let b = RedisLocker::connect(server.config(&prefix))
        .await
        .expect("connect");
    let guard = within(
        Duration::from_secs(10),
        "the lock is free, not held by a ghost for a minute",
        b.lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(8)),
        ),
    )
    .await
    .expect("lock");
    released(fencelock::LockGuard::release(guard).await);
}
