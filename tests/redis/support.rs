//! Helpers shared by the Redis tests.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockError, LockOptions, ReleaseOutcome};
use futures_util::{Stream, StreamExt};
use redis::aio::MultiplexedConnection;

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

/// Runs an acquisition `call` through `proxy` (holding requests) until the proxy keeps its
/// request, and gives up on it there: the request is written and kept, the caller gone.
/// (The proxy's event, not a timer: a timer could fire before a loaded machine sent it,
/// and the test would pass without an attempt in flight.)
pub async fn abandon_once_kept<T>(proxy: &FaultProxy, call: impl Future<Output = T>) {
    let finished = within(
        Duration::from_secs(10),
        "the proxy keeps the attempt",
        async {
            tokio::select! {
                biased;
                () = proxy.requests_held(1) => false,
                _ = call => true,
            }
        },
    )
    .await;
    assert!(!finished, "the acquisition cannot finish while kept");
}

/// Waits until each token counter of `counters` has been drawn: an attempt delivered
/// late has been applied.
pub async fn until_drawn(server: &RedisServer, counters: &[String]) {
    let mut conn = direct(server).await;
    within(
        Duration::from_secs(10),
        "the late attempt is applied",
        async {
            loop {
                let drawn: Vec<Option<u64>> = redis::cmd("MGET")
                    .arg(counters)
                    .query_async(&mut conn)
                    .await
                    .expect("MGET");
                if drawn.iter().all(Option::is_some) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
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

// Waiting on release messages (`publish_only_when_waited.rs`, the `lock_all_*` tests).

/// Longer than any bound a test allows for a wake-up.
pub const LONG: Duration = Duration::from_secs(60);
/// How long a woken waiter may take to hold the lock.
pub const PROMPT: Duration = Duration::from_secs(10);

pub fn long_held() -> LockOptions {
    LockOptions::new().with_ttl(LONG)
}

/// A locker whose waiters, without a release message, sleep a minute between attempts.
pub async fn sleepy_locker(server: &RedisServer, prefix: &str) -> RedisLocker {
    RedisLocker::connect(server.config(prefix).with_max_wait_sleep(LONG))
        .await
        .expect("connect")
}

pub async fn direct(server: &RedisServer) -> MultiplexedConnection {
    server.connection().await.expect("connect")
}

/// How many waiters the lock's (or semaphore's) waiters' set holds.
pub async fn waiters(conn: &mut MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

pub async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<u64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// Waits until the waiters' set `key` holds `count` waiters (a condition the server
/// reports, polled: there is no event for it).
pub async fn until_waiters(conn: &mut MultiplexedConnection, key: &str, count: u64) {
    within(
        Duration::from_secs(10),
        &format!("{count} waiters in {key}"),
        async {
            while waiters(conn, key).await != count {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
}

/// A raw subscriber of one channel, to count what releases publish.
pub struct Listener {
    channel: String,
    messages: std::pin::Pin<Box<dyn Stream<Item = String> + Send>>,
}

impl Listener {
    pub async fn new(server: &RedisServer, channel: &str) -> Self {
        let mut pubsub = redis::Client::open(server.url())
            .expect("client")
            .get_async_pubsub()
            .await
            .expect("pubsub");
        // Subscribed once this returns: every later publish is delivered.
        pubsub.subscribe(channel).await.expect("subscribe");
        let messages = pubsub
            .into_on_message()
            .map(|message| message.get_payload::<String>().expect("payload"));
        Self {
            channel: channel.to_owned(),
            messages: Box::pin(messages),
        }
    }

    /// Everything published on the channel until now: publishes a marker and reads up to
    /// it (the server delivers in order, so whatever was published before the marker
    /// arrives before it; no waiting for messages that might come).
    pub async fn published(&mut self, conn: &mut MultiplexedConnection) -> Vec<String> {
        let marker = format!("marker-{}", rand_suffix());
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(&marker)
            .query_async::<u64>(conn)
            .await
            .expect("PUBLISH");
        let mut seen = Vec::new();
        loop {
            let message = within(Duration::from_secs(10), "the marker", self.messages.next())
                .await
                .expect("subscription open");
            if message == marker {
                return seen;
            }
            seen.push(message);
        }
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A locker that reaches `server` only through a proxy (returned: keep it alive) that,
/// once connected, delays every chunk by 300 ms each way: each of its requests reaches the
/// server at least 600 ms after the one before was answered, long enough for another
/// client's request to land in between. Its waiters sleep a minute without a message.
pub async fn slow_sleepy_locker(server: &RedisServer, prefix: &str) -> (FaultProxy, RedisLocker) {
    let proxy = proxy_to(server).await;
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(prefix)
        .with_connect_timeout(Duration::from_secs(30))
        .with_request_timeout(Duration::from_secs(5))
        .with_max_wait_sleep(LONG);
    let locks = RedisLocker::connect(config).await.expect("connect");
    // Connected at full speed; from now on a slow link.
    proxy.delay(Duration::from_millis(300));
    (proxy, locks)
}

/// Every command a server runs, as MONITOR shows it: `1700000000.000000 [0
/// 127.0.0.1:4567] "SET" ...` (a script's own commands: `[0 lua]`).
pub struct Monitor {
    lines: std::pin::Pin<Box<dyn Stream<Item = String> + Send>>,
}

impl Monitor {
    /// MONITOR is on once this returns: every later command is seen.
    pub async fn start(server: &RedisServer) -> Self {
        let monitor = redis::Client::open(server.url())
            .expect("client")
            .get_async_monitor()
            .await
            .expect("monitor");
        Self {
            lines: Box::pin(monitor.into_on_message::<String>()),
        }
    }

    /// The next command, within 10 s (`what` names it in the failure).
    pub async fn next(&mut self, what: &str) -> String {
        within(Duration::from_secs(10), what, self.lines.next())
            .await
            .expect("monitor stream")
    }
}

/// The client a MONITOR line names: `1700000000.000000 [0 127.0.0.1:4567] "SET" ...`.
pub fn client_of(line: &str) -> String {
    line.split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(client, _)| client.to_owned())
        .unwrap_or_default()
}
