//! `lock_all` on Redlock: the all-or-none script on every master, granted when a majority
//! of masters took every lock within the validity; otherwise every lock is undone on every
//! master. Each lock's token is the largest of the agreeing masters'.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{owner_part, prefix, released, within};

/// Sets `key` on `master` to a value of no fencelock client's (a holder elsewhere).
async fn occupy(master: &RedisServer, key: &str) {
    let mut conn = master.connection().await.expect("connect");
    redis::cmd("SET")
        .arg(key)
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_on_a_majority_or_none_anywhere() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let prefix = prefix("redlock-all");
    let config = RedisConfig::masters(masters.iter().map(RedisServer::url))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_millis(500));
    let locks = RedlockLocker::connect(config).await.expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    let key = |name: &str| format!("{prefix}:lock:{name}");

    // `b` taken on one master: the other two make a majority that takes both.
    occupy(&masters[0], &key("b")).await;
    let both = locks
        .try_lock_all(&["b", "a"], &options)
        .await
        .expect("try")
        .expect("a majority has both free");
    let owner = both.guards()[0].owner().to_owned();
    for master in &masters[1..] {
        for name in ["a", "b"] {
            let stored = master.get(&key(name)).await.expect("get");
            assert_eq!(
                owner_part(stored.as_deref()),
                Some(owner.as_str()),
                "{name}"
            );
        }
    }
    // Master 0 refused as a whole: not even `a` was taken there.
    assert_eq!(masters[0].get(&key("a")).await.expect("get"), None);
    let tokens: Vec<u64> = both.tokens().iter().map(|(_, t)| t.get()).collect();
    assert_eq!(tokens, [1, 1], "each lock's own counter");
    released(both.release().await);
    for master in &masters[1..] {
        assert_eq!(master.get(&key("a")).await.expect("get"), None);
        assert_eq!(master.get(&key("b")).await.expect("get"), None);
    }

    // `b` taken on a second master: no majority; the grant on the third is undone.
    occupy(&masters[1], &key("b")).await;
    assert!(
        locks
            .try_lock_all(&["a", "b"], &options)
            .await
            .expect("try")
            .is_none()
    );
    let waited = locks
        .lock_all(
            &["a", "b"],
            &options
                .clone()
                .with_wait_timeout(Duration::from_millis(400)),
        )
        .await;
    assert!(
        matches!(&waited, Err(err) if err.is_wait_timeout()),
        "{waited:?}"
    );
    within(
        Duration::from_secs(5),
        "every partial grant undone",
        async {
            loop {
                let mut left = 0;
                for master in &masters {
                    left += usize::from(master.get(&key("a")).await.expect("get").is_some());
                }
                if left == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    let stored = masters[2].get(&key("b")).await.expect("get");
    assert_eq!(stored, None, "b undone on the master that granted it");
}
