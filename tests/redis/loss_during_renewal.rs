//! A lock whose deadline passes while a renewal hangs (a majority of Redlock masters
//! stopped answering) is reported lost at its own deadline, not when the hanging renewal
//! finally gives up.
//!
//! Since issue 21 a renewal no longer waits for a minority that stopped answering, and
//! gives up an unanswered attempt after a third of the renewal interval: the renewal
//! hangs only while a majority is silent, and then for at most that third. The deadline
//! here falls inside such an attempt.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{prefix, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_deadline_passes_while_a_renewal_hangs_is_lost_on_time() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("master"));
    }
    let mut proxies = Vec::new();
    for master in &masters[1..] {
        let address = format!("127.0.0.1:{}", master.port())
            .parse()
            .expect("address");
        proxies.push(FaultProxy::start(address).await.expect("proxy"));
    }
    let mut urls = vec![masters[0].url()];
    urls.extend(proxies.iter().map(|p| format!("redis://{}/", p.address())));
    let config = RedisConfig::masters(urls)
        .with_prefix(prefix("renewal-hang"))
        .with_request_timeout(Duration::from_millis(1500));
    let locks = RedlockLocker::connect(config).await.expect("connect");

    // A is renewed every second; each renewal attempt without a majority's answer waits
    // a third of that (333 ms) before it is given up.
    let a = locks
        .lock("a", &LockOptions::new().with_ttl(Duration::from_secs(3)))
        .await
        .expect("lock a");
    // B is not renewed: its deadline, 1.2 s from now, falls inside A's first renewal
    // attempt (1 s to 1.33 s from A's grant), which gets no majority's answer.
    let sent = Instant::now();
    let ttl = Duration::from_millis(1200);
    let b = locks
        .lock("b", &LockOptions::new().with_ttl(ttl).with_renewal(false))
        .await
        .expect("lock b");
    for proxy in &proxies {
        proxy.pause();
    }
    let lost = within(Duration::from_secs(5), "b reported lost", b.lost()).await;
    let reported = sent.elapsed();
    for proxy in &proxies {
        proxy.resume();
    }
    assert!(
        reported <= ttl + Duration::from_millis(100),
        "b ({ttl:?} from {sent:?}) reported lost ({lost}) after {reported:?}"
    );
    assert!(a.is_held());
    drop(a);
}
