//! Redlock decides at a quorum, not at the slowest master (issue 21, item 2): one master
//! that stops answering (its packets held, no reset) costs neither acquisition nor
//! renewal the request timeout. Before, every round waited for every master, so each
//! renewal took the 2 s request timeout and a lock with a TTL near 2 s was never granted.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{prefix, released};

/// Three masters, the third behind a proxy; a locker connected to all three, then the
/// proxy paused: the third master answers nothing from now on, its connection stays open.
async fn one_master_stalled(test: &str) -> (Vec<RedisServer>, FaultProxy, RedlockLocker) {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let third = format!("127.0.0.1:{}", masters[2].port())
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(third).await.expect("proxy");
    let urls = vec![
        masters[0].url(),
        masters[1].url(),
        format!("redis://{}/", proxy.address()),
    ];
    // The default request timeout (2 s).
    let locks = RedlockLocker::connect(RedisConfig::masters(urls).with_prefix(prefix(test)))
        .await
        .expect("connect");
    proxy.pause();
    (masters, proxy, locks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_costs_neither_acquisition_nor_renewal_the_request_timeout() {
    let (_masters, proxy, locks) = one_master_stalled("slow-master-renew").await;
    let ttl = Duration::from_secs(3);
    let started = Instant::now();
    let guard = locks
        .lock("job", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("granted by two of three masters");
    let took = started.elapsed();
    assert!(
        took < ttl / 10 + Duration::from_millis(200),
        "acquisition took {took:?}: it waited for the stalled master"
    );
    // Two whole TTLs: every renewal must be confirmed by the two healthy masters in time.
    let lost = tokio::time::timeout(2 * ttl, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the lock was reported lost ({lost:?}) although two of three masters renewed it"
    );
    assert!(guard.is_held());
    // Released by the two healthy masters, without waiting for the stalled one.
    let started = Instant::now();
    released(guard.release().await);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "release took {took:?}: it waited for the stalled master"
    );
    proxy.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_does_not_stop_a_short_lock_from_being_granted() {
    let (_masters, proxy, locks) = one_master_stalled("slow-master-short").await;
    let ttl = Duration::from_millis(1900);
    let started = Instant::now();
    let guard = locks
        .try_lock("short", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("no error")
        .expect("granted by two of three masters within its validity");
    let took = started.elapsed();
    assert!(took < ttl / 2, "acquisition took {took:?}");
    proxy.resume();
    released(guard.release().await);
}
