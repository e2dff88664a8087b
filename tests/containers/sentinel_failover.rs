//! Redis with Sentinel (the compose deployment): the replica's replication link is cut
//! while a client locks (asynchronous replication's window, made deterministic), then the
//! master is partitioned from everyone. The Sentinels promote the replica and a second
//! client takes the same lock there, with the same token, while the first still believes
//! it holds it: the lost lock the design documents, reproduced.
//!
//! The faults are iptables rules in the containers' network namespaces (root, as in CI):
//! disconnecting the master from the Docker network instead makes its name stop resolving,
//! and Sentinel 7.0 (`resolve-hostnames`) then never declares it down.

use std::time::Duration;

use futures_util::StreamExt;

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::{LockBackend, LockGuard, LockOptions};

use super::compose::{self, netns_iptables};

/// A subscription to Sentinel's `+switch-master` event: the failover, announced.
async fn switch_master_events(port: &str) -> redis::aio::PubSub {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    let mut pubsub = client.get_async_pubsub().await.expect("sentinel pubsub");
    pubsub.subscribe("+switch-master").await.expect("subscribe");
    pubsub
}

/// Waits until the Sentinel on `port` knows the replica and both other Sentinels: only
/// then can it take part in a failover. It learns them from the master's `INFO` (every
/// 10 s) and from hello messages (every 2 s), so right after start-up it may not yet.
/// Subscribes to the discovery events first, then checks, then awaits an event: a
/// discovery between the check and the wait is not missed.
async fn sentinel_ready(port: &str) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    let mut discoveries = client.get_async_pubsub().await.expect("sentinel pubsub");
    discoveries
        .subscribe(&["+slave", "+sentinel"])
        .await
        .expect("subscribe");
    let mut events = discoveries.on_message();
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("sentinel connection");
    loop {
        let state: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("master")
            .arg("fencelock")
            .query_async(&mut connection)
            .await
            .expect("SENTINEL master");
        let count = |field: &str| {
            state
                .get(field)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        if count("num-slaves") >= 1 && count("num-other-sentinels") >= 2 {
            return;
        }
        tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .unwrap_or_else(|_| panic!("sentinel on {port} still incomplete: {state:?}"))
            .expect("the sentinel's event stream ended");
    }
}

fn locker_config(port: &str) -> RedisConfig {
    RedisConfig::new(format!("redis://127.0.0.1:{port}/"))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_after_a_master_partition_loses_a_held_lock() {
    let project = compose::up();
    for sentinel in [
        "FENCELOCK_SENTINEL1_PORT",
        "FENCELOCK_SENTINEL2_PORT",
        "FENCELOCK_SENTINEL3_PORT",
    ] {
        sentinel_ready(project.port(sentinel)).await;
    }
    let mut failovers = switch_master_events(project.port("FENCELOCK_SENTINEL1_PORT")).await;
    let master = project.container("redis-master");
    let replica = project.container("redis-replica");

    let first = RedisLocker::connect(locker_config(project.port("FENCELOCK_REDIS_PORT")))
        .await
        .expect("connect to the master");
    let options = LockOptions::new().with_ttl(Duration::from_secs(15));
    // Replication traffic to the replica is reset while the lock is taken, so it never
    // receives the lock (nor the token increment).
    let reset_replication = [
        "INPUT",
        "-p",
        "tcp",
        "--sport",
        "6379",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ];
    netns_iptables(&replica, &[&["-A"][..], &reset_replication].concat());
    let held = first.lock("orders", &options).await.expect("first locks");
    // The master is partitioned: nothing in, nothing out, clients included.
    netns_iptables(&master, &["-A", "INPUT", "-j", "DROP"]);
    netns_iptables(&master, &["-A", "OUTPUT", "-j", "DROP"]);
    netns_iptables(&replica, &[&["-D"][..], &reset_replication].concat());

    // Sentinel's own failover: down-after 2 s, then election and promotion.
    let announced = tokio::time::timeout(Duration::from_secs(60), failovers.on_message().next())
        .await
        .expect("no failover within 60 s")
        .expect("the sentinel's event stream ended");
    let switch: String = announced.get_payload().expect("payload");
    assert!(
        switch.contains("redis-replica"),
        "unexpected failover: {switch}"
    );

    let second = RedisLocker::connect(locker_config(project.port("FENCELOCK_REDIS_REPLICA_PORT")))
        .await
        .expect("connect to the promoted replica");
    let taken = second
        .try_lock("orders", &options)
        .await
        .expect("try_lock")
        .expect("the promoted replica never saw the first lock");
    assert!(
        held.is_held(),
        "the first holder already knew it lost the lock: no overlap to show"
    );
    // The token counter was lost with the lock: the second grant repeats a token.
    assert!(
        taken.token() <= held.token(),
        "{} after {}",
        taken.token(),
        held.token()
    );
}
