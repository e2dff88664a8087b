//! A pub/sub connection killed again soon after each reconnect (a `CLIENT KILL` cron,
//! `maxmemory-clients` eviction, a proxy that recycles connections) is reopened with a
//! backoff that carries over from one loss to the next, reset only once a connection has
//! stayed up for a while: a handful of reconnects a second, not one per kill.
//!
//! Before, every recovery started afresh and reconnected at once: the client reopened the
//! connection at round-trip speed, each time subscribing every waited channel and waking
//! every waiter (each of which tried again and registered again: about two requests per
//! waiter per reconnect).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{direct, locker, prefix, redis, released, within};

/// Waiters of one client, one per name.
const WAITERS: usize = 16;
/// How long a waiter sleeps without a message: longer than the test.
const SLEEP: Duration = Duration::from_secs(30);

async fn connections_received(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

/// How many of `channels` have a subscriber.
async fn subscribed(conn: &mut MultiplexedConnection, channels: &[String]) -> usize {
    let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channels)
        .query_async(conn)
        .await
        .expect("PUBSUB NUMSUB");
    counts
        .chunks(2)
        .filter(|pair| matches!(pair, [_, redis::Value::Int(n)] if *n > 0))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_connection_killed_again_and_again_is_reopened_with_a_backoff() {
    let server = redis().await;
    let prefix = prefix("pubsub-backoff");
    let holder = locker(&server, &prefix).await;
    let waiting =
        fencelock::redis::RedisLocker::connect(server.config(&prefix).with_max_wait_sleep(SLEEP))
            .await
            .expect("connect");
    let names: Vec<String> = (0..WAITERS).map(|n| format!("job-{n}")).collect();
    let held = LockOptions::new().with_ttl(Duration::from_secs(60));
    let mut guards = Vec::new();
    for name in &names {
        guards.push(holder.lock(name, &held).await.expect("lock"));
    }
    let mut waiters = JoinSet::new();
    for name in names.clone() {
        let waiting = waiting.clone();
        waiters.spawn(async move {
            let guard = waiting
                .lock(&name, &LockOptions::new())
                .await
                .expect("granted");
            (name, guard)
        });
    }
    let mut conn = direct(&server).await;
    let channels: Vec<String> = names
        .iter()
        .map(|name| format!("{prefix}:released:{name}"))
        .collect();
    within(Duration::from_secs(10), "every waiter subscribed", async {
        // No event tells another client that a subscription landed: polled.
        while subscribed(&mut conn, &channels).await < WAITERS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    let before = connections_received(&mut conn).await;
    let started = Instant::now();
    let mut kills = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        let killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .expect("CLIENT KILL");
        kills += killed;
        // The killing's pace (a cron's), not a synchronisation.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let reconnects = connections_received(&mut conn).await - before;
    // At once, then 100 ms doubling to at most 1 s, jittered: 0, 0.1, 0.3, 0.7, 1.5 s ...
    // about five in two seconds. Before: one per kill, hundreds.
    assert!(
        reconnects <= 12,
        "{reconnects} reconnects in 2 s ({kills} connections killed)"
    );

    // Left alone, the connection is back within the longest pause, every channel
    // subscribed again: a release wakes its waiter well within its 30 s sleep.
    within(
        Duration::from_secs(5),
        "every channel subscribed again",
        async {
            while subscribed(&mut conn, &channels).await < WAITERS {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    let first = guards.remove(0);
    released(first.release().await);
    let (name, _granted) = within(
        Duration::from_secs(5),
        "the woken waiter",
        waiters.join_next(),
    )
    .await
    .expect("a waiter")
    .expect("join");
    assert_eq!(name, names[0]);
    drop(guards);
}
