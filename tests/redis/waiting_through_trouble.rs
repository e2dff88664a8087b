//! A waiting acquisition rides out trouble (issue 21, item 6): a Redis restart while it
//! waits does not end the wait with an error (before, the first failed attempt did, and
//! `fencelock run --wait 30s` exited 70), and a lock key without expiry, written by
//! someone else, makes waiters back off instead of retrying every millisecond.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockOptions};

use crate::support::{locker, prefix, redis, within};

/// Waits until `channel` has a subscriber (a waiter waiting for the release message).
async fn subscribed(server: &RedisServer, channel: &str) {
    within(Duration::from_secs(10), "the waiter subscribes", async {
        loop {
            let mut conn = server.connection().await.expect("connect");
            let reply: (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut conn)
                .await
                .expect("PUBSUB NUMSUB");
            if reply.1 >= 1 {
                return;
            }
            // No event tells another client that a subscription landed: look every 10 ms.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_during_a_wait_does_not_end_the_wait() {
    let mut server = redis().await;
    let prefix = prefix("restart-wait");
    let holder = locker(&server, &prefix).await;
    let waiter = locker(&server, &prefix).await;
    let held = holder
        .lock("job", &LockOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .expect("lock");
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().with_wait_timeout(Duration::from_secs(30));
        let result = waiter.lock("job", &options).await;
        (waiter, result)
    });
    subscribed(&server, &format!("{prefix}:released:job")).await;
    // Restarted empty (nothing is persisted): the lock is free once the server is back,
    // and the waiter's connections are broken.
    server.restart().await.expect("restart");
    let (_waiter, result) = within(Duration::from_secs(20), "the waiter is done", waiting)
        .await
        .expect("join");
    let guard = result.expect("granted after the restart, within the wait");
    drop(guard);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_without_expiry_makes_waiters_back_off() {
    let server = redis().await;
    let prefix = prefix("no-expiry");
    let waiter = locker(&server, &prefix).await;
    // Someone else's key with no expiry (PTTL -1): not ours to remove.
    let mut conn = server.connection().await.expect("connect");
    redis::cmd("SET")
        .arg(format!("{prefix}:lock:job"))
        .arg("someone-else")
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");
    server.reset_stats().await.expect("reset stats");
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(1));
    let err = waiter
        .lock("job", &options)
        .await
        .expect_err("the key never expires");
    assert!(err.is_wait_timeout(), "{err}");
    let attempts = server.command_calls("set").await.expect("commandstats");
    assert!(
        attempts <= 10,
        "{attempts} attempts in 1 s on a key without expiry: the waiter spun"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_a_majority_of_redlock_masters_during_a_wait_does_not_end_the_wait() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(redis().await);
    }
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let config = RedisConfig::masters(urls).with_prefix(prefix("redlock-restart-wait"));
    let holder = RedlockLocker::connect(config.clone())
        .await
        .expect("connect");
    let waiter = RedlockLocker::connect(config).await.expect("connect");
    let held = holder
        .lock("job", &LockOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .expect("lock");
    masters[0].reset_stats().await.expect("reset stats");
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().with_wait_timeout(Duration::from_secs(30));
        let result = waiter.lock("job", &options).await;
        (waiter, result)
    });
    // The waiter's attempts show on the first master: once one did, it is waiting.
    within(Duration::from_secs(10), "the waiter attempts", async {
        while masters[0].command_calls("set").await.expect("commandstats") < 1 {
            // INFO is the only way to see another client's attempts: look every 10 ms.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Two of three masters restart empty: the waiter's next attempt fails on both (their
    // connections broke), then the lock is free on them.
    masters[0].restart().await.expect("restart");
    masters[1].restart().await.expect("restart");
    let (_waiter, result) = within(Duration::from_secs(20), "the waiter is done", waiting)
        .await
        .expect("join");
    let guard = result.expect("granted by the restarted majority, within the wait");
    drop(guard);
    drop(held);
}
