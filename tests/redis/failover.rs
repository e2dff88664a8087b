//! The article's failure, reproduced: the master takes a lock, dies before the write
//! reaches its replica, the replica is promoted, and a second client takes the same lock
//! while the first still holds its guard. These tests pass because they *observe* the
//! failure: they document what the Redis lock cannot promise (see docs/redis.md).

use std::time::Duration;

use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::prefix;

struct Failover {
    master: RedisServer,
    replica: RedisServer,
}

impl Failover {
    async fn start() -> Self {
        let master = RedisServer::start().await.expect("master");
        let replica = RedisServer::start_replica_of(&master)
            .await
            .expect("replica");
        Self { master, replica }
    }

    /// Kills the master and promotes the replica, as Sentinel would.
    async fn fail_over(&mut self) {
        self.master.kill().expect("kill master");
        self.replica.promote().await.expect("promote");
        assert!(self.replica.is_master().await.expect("role"));
    }
}

#[tokio::test]
async fn a_failover_lets_a_second_client_take_a_held_lock() {
    let mut servers = Failover::start().await;
    let prefix = prefix("failover");
    let a = fencelock::redis::RedisLocker::connect(servers.master.config(&prefix))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));

    // Replication breaks; then the lock is taken: it exists on the master only.
    servers.replica.break_replication().await.expect("break");
    let first = a
        .lock("payment:8891", &options)
        .await
        .expect("lock on the master");
    servers.fail_over().await;

    let b = fencelock::redis::RedisLocker::connect(servers.replica.config(&prefix))
        .await
        .expect("connect to the new master");
    let second = b
        .try_lock("payment:8891", &options)
        .await
        .expect("try_lock")
        .expect("the new master has never heard of the lock");

    // Two holders at once, each believing it owns the lock.
    assert!(first.is_held(), "the first holder's lease has not run out");
    assert!(second.is_held());
}

#[tokio::test]
async fn a_failover_makes_the_token_counter_repeat() {
    let mut servers = Failover::start().await;
    let prefix = prefix("failover-token");
    let a = fencelock::redis::RedisLocker::connect(servers.master.config(&prefix))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));

    // One grant that does reach the replica...
    let replicated = a.lock("ledger", &options).await.expect("lock");
    let t1 = replicated.token();
    crate::support::released(replicated.release().await);
    servers
        .master
        .wait_for_replica(&servers.replica, Duration::from_secs(5))
        .await
        .expect("replicated");
    let counter = format!("{prefix}:token:ledger");
    assert_eq!(
        servers.replica.get(&counter).await.expect("get"),
        Some(t1.to_string())
    );

    // ...and one that does not.
    servers.replica.break_replication().await.expect("break");
    let lost = a.lock("ledger", &options).await.expect("lock");
    let t2 = lost.token();
    assert!(t2 > t1);
    servers.fail_over().await;

    let b = fencelock::redis::RedisLocker::connect(servers.replica.config(&prefix))
        .await
        .expect("connect to the new master");
    let after = b.lock("ledger", &options).await.expect("lock");
    // The counter went back to t1 with the failover: the next grant repeats t2.
    assert_eq!(after.token(), t2, "token repeated after failover");
}
