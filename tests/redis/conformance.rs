//! The backend contract (`fencelock::testkit::conformance`) on Redis and on Redlock: three
//! clients each, the lock's key deleted behind the holder's back (on every master).

use std::time::Duration;

use fencelock::redis::{RedisGuard, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::testkit::conformance::Contract;

use crate::support::{locker, prefix, redis};

/// Deletes `key` on each of `servers` (what an operator's `DEL`, or an eviction, does).
fn delete_key(
    servers: Vec<redis::aio::MultiplexedConnection>,
) -> impl Fn(&RedisGuard) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    move |guard: &RedisGuard| {
        let (servers, key) = (servers.clone(), guard.key().to_owned());
        Box::pin(async move {
            for mut server in servers {
                let _: i64 = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut server)
                    .await
                    .expect("DEL");
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_backend_contract() {
    let server = redis().await;
    let prefix = prefix("contract");
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(locker(&server, &prefix).await);
    }
    let admin = server.connection().await.expect("admin connection");
    Contract::new(clients)
        .with_ttl(Duration::from_millis(500))
        .with_take_away(delete_key(vec![admin]))
        .run_all()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_the_backend_contract() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("redis-server"));
    }
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let prefix = prefix("contract-redlock");
    let mut clients = Vec::new();
    for _ in 0..3 {
        let config = fencelock::redis::RedisConfig::masters(urls.clone()).with_prefix(&prefix);
        clients.push(RedlockLocker::connect(config).await.expect("connect"));
    }
    let mut admins = Vec::new();
    for master in &masters {
        admins.push(master.connection().await.expect("admin connection"));
    }
    Contract::new(clients)
        .with_ttl(Duration::from_millis(500))
        .with_take_away(delete_key(admins))
        .run_all()
        .await;
}
