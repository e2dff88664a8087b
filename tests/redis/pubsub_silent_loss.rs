//! A pub/sub connection that dies without closing (no FIN, no reset: its host crashed
//! behind the same address, a failover behind a VIP, a load balancer that forgot the flow)
//! is noticed, by a `PING` the subscriber sends while anyone waits, and replaced: every
//! waited channel subscribed again, every waiter woken.
//!
//! Before, only the end of the stream or a timed-out (un)subscribe told the subscriber: an
//! idle connection that went silent stayed in place for as long as the name had a waiter,
//! every release published to no one listening, and each handoff cost a whole
//! `max_wait_sleep` (here 10 s).

use std::sync::Arc;
use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker};
use tokio::sync::watch;

use crate::support::{prefix, proxy_to, redis};
use crate::turns::{TASKS, take_turns, until_every_task_is_granted};

/// How long a waiter sleeps without a message: far longer than any bound below.
const SLEEP: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_connection_that_goes_silent_is_replaced_for_the_waiters_waiting() {
    let server = redis().await;
    let proxy = proxy_to(&server).await;
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(prefix("pubsub-silent"))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
        .with_max_wait_sleep(SLEEP);
    let locks = RedisLocker::connect(config).await.expect("connect");
    let grants = Arc::new(watch::channel([0; TASKS]).0);
    let tasks = take_turns(&locks, &grants);
    // Handoffs by release message: every task granted twice, well within one sleep.
    until_every_task_is_granted(&grants, [0; TASKS], 2, SLEEP / 2, "turns before the loss").await;
    // The locker's connections: its commands' (opened at connect), then its pub/sub one
    // (opened by the first wait).
    assert_eq!(
        proxy.connections_accepted(),
        2,
        "one command and one pub/sub connection"
    );
    proxy.blackhole(2);
    // The waiters sleep 10-12 s from their last refusal, a moment ago (every release
    // woke them all): only a subscription that works again (or the new connection's
    // wake-up) lets each task in twice within 8 s. A ping every second (the default),
    // answered within the 1 s request timeout or not at all, finds the silence within
    // 2 s (measured: 1.9-3.2 s to every task's second grant).
    let since = *grants.borrow();
    until_every_task_is_granted(
        &grants,
        since,
        2,
        Duration::from_secs(8),
        "every task granted twice after its pub/sub connection went silent",
    )
    .await;
    assert_eq!(
        proxy.connections_accepted(),
        3,
        "one new pub/sub connection; the command connection kept"
    );
    drop(tasks);
}
