//! An acquire abandoned while its request is in flight leaves no lock behind, even when
//! the request reaches the server after the caller gave up.

use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::{LockBackend, LockOptions};

use crate::support::{locker_through, prefix, proxy_to, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_in_flight_acquire_leaves_no_lock() {
    let server = redis().await;
    let prefix = prefix("abandoned");
    let proxy = proxy_to(&server).await;
    let a = locker_through(&proxy, &prefix, Duration::from_secs(10)).await;
    let long = LockOptions::new().with_ttl(Duration::from_secs(60));

    // The request is written and kept by the proxy; the caller gives up on it the moment
    // it is kept (the proxy's event, not a timer: a timer could fire before a loaded
    // machine sent it, and the test would pass without an attempt in flight).
    proxy.hold_requests();
    let call = a.lock("job", &long);
    let answered = within(
        Duration::from_secs(10),
        "the proxy keeps the attempt",
        async {
            tokio::select! {
                biased;
                () = proxy.requests_held(1) => None,
                outcome = call => Some(outcome),
            }
        },
    )
    .await;
    assert!(answered.is_none(), "the acquire cannot finish while kept");
    // Now it arrives and takes the lock for a minute; the cleanup sent behind it (kept
    // too, or sent after) must remove it again. The proxy opens only once the attempt
    // has been applied (its INCR drew token 1): a cleanup sent after could otherwise
    // overtake the late delivery.
    proxy.deliver_held();
    let mut direct = redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let counter = format!("{prefix}:token:job");
    within(
        Duration::from_secs(10),
        "the late attempt is applied",
        async {
            loop {
                let drawn: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut direct)
                    .await
                    .expect("GET");
                if drawn.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    proxy.resume();

    let b = RedisLocker::connect(server.config(&prefix))
        .await
        .expect("connect");
    let guard = within(
        Duration::from_secs(10),
        "the lock is free, not held by a ghost for a minute",
        b.lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(8)),
        ),
    )
    .await
    .expect("lock");
    released(fencelock::LockGuard::release(guard).await);
}
