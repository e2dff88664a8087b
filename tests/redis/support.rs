//! Helpers shared by the Redis tests.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockError, ReleaseOutcome};

pub async fn redis() -> RedisServer {
    RedisServer::start().await.expect("start redis-server")
}

/// A key prefix no other test uses.
pub fn prefix(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("test-{test}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub async fn locker(server: &RedisServer, prefix: &str) -> RedisLocker {
    RedisLocker::connect(server.config(prefix))
        .await
        .expect("connect to redis")
}

/// A fault proxy in front of `server`.
pub async fn proxy_to(server: &RedisServer) -> FaultProxy {
    let address = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("address");
    FaultProxy::start(address).await.expect("proxy")
}

/// A locker that reaches Redis only through `proxy`, under `prefix`, with the given
/// request timeout.
pub async fn locker_through(
    proxy: &FaultProxy,
    prefix: &str,
    request_timeout: Duration,
) -> RedisLocker {
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(prefix)
        .with_request_timeout(request_timeout);
    RedisLocker::connect(config)
        .await
        .expect("connect through the proxy")
}

/// Fails the test if `future` takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}

/// Asserts a release found the lock still ours and freed it.
pub fn released(outcome: Result<ReleaseOutcome, LockError>) {
    assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
}

/// The owner value at the start of a lock key's stored value (before the line break
/// and the holder record that follow it, if any).
pub fn owner_part(stored: Option<&str>) -> Option<&str> {
    stored.map(|value| value.split('\n').next().unwrap_or(value))
}
