//! A lock registered while a renewal hangs (one Redlock master stopped answering) is still
//! reported lost at its own deadline, not when the hanging renewal finally returns.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedlockLocker};
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::time::Instant;

use crate::support::{prefix, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_while_a_renewal_hangs_is_lost_on_time() {
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
    let request_timeout = Duration::from_millis(1500);
    let config = RedisConfig::masters(urls)
        .with_prefix(prefix("renewal-hang"))
        .with_request_timeout(request_timeout);
    let locks = RedlockLocker::connect(config).await.expect("connect");

    // A is renewed every second; from now on each renewal waits 1.5 s for master 3.
    let a = locks
        .lock("a", &LockOptions::new().with_ttl(Duration::from_secs(3)))
        .await
        .expect("lock a");
    proxy.pause();
    // B's attempt also waits 1.5 s for master 3, so B is granted (by masters 1-2, with
    // what is left of its 1.8 s) while A's first renewal (at 1 s) hangs until 2.5 s.
    let sent = Instant::now();
    let ttl = Duration::from_millis(1800);
    let b = locks
        .lock("b", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock b with 2 of 3 masters");
    let lost = within(Duration::from_secs(5), "b reported lost", b.lost()).await;
    let reported = sent.elapsed();
    proxy.resume();
    // B could not be renewed (master 3 hangs every renewal): it runs out at its TTL, and
    // must be reported then, not when A's renewal comes back.
    assert!(
        reported <= ttl + Duration::from_millis(150),
        "b ({ttl:?} from {sent:?}) reported lost ({lost}) after {reported:?}"
    );
    assert!(a.is_held());
    drop(a);
}
