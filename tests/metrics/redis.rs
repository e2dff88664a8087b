//! Redis: grants, held locks, releases, renewals, a loss found by the renewal task
//! (the key deleted behind the holder's back), and a token counter that went backwards.

use std::time::Duration;

use fencelock::metrics::names;
use fencelock::redis::RedisLocker;
use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::recorded::recorded;

const REDIS: (&str, &str) = ("backend", "redis");

#[tokio::test]
async fn redis_operations_are_counted() {
    let metrics = recorded();
    let server = RedisServer::start().await.expect("redis-server");
    let locks = RedisLocker::connect(server.config("metrics"))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_millis(600));

    let held = locks.lock("m-redis", &options).await.expect("lock");
    assert_eq!(
        metrics.counter(names::GRANTS, &[REDIS, ("lock", "m-redis")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[REDIS]), 1.0);
    let renewed = metrics
        .counter_reaches(
            names::RENEWALS,
            &[REDIS, ("outcome", "ok")],
            1,
            Duration::from_secs(3),
        )
        .await;
    assert!(renewed >= 1, "no renewal counted");
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[REDIS, ("outcome", "released")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[REDIS]), 0.0);
    assert_eq!(metrics.samples(names::HOLD_SECONDS, &[REDIS]).len(), 1);

    // A loss: the key deleted; the next renewal finds the lock is not ours.
    let held = locks.lock("m-redis-lost", &options).await.expect("lock");
    let mut admin = server.connection().await.expect("admin connection");
    let _: i64 = redis::cmd("DEL")
        .arg(held.key())
        .query_async(&mut admin)
        .await
        .expect("DEL");
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::Revoked);
    assert_eq!(
        metrics.counter(names::LOSSES, &[REDIS, ("reason", "revoked")]),
        1
    );
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[REDIS, ("outcome", "not_held")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[REDIS]), 0.0);

    // The token counter flushed: the next grant's token went backwards, is counted, and
    // the counter is moved forward.
    let held = locks.lock("m-redis", &options).await.expect("lock");
    let last = held.token();
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .expect("FLUSHALL");
    assert_eq!(metrics.counter(names::TOKEN_REGRESSIONS, &[REDIS]), 0);
    let held = locks.lock("m-redis", &options).await.expect("lock");
    assert!(held.token() > last);
    assert_eq!(metrics.counter(names::TOKEN_REGRESSIONS, &[REDIS]), 1);
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
