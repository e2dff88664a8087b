//! An acquire abandoned while its request is in flight leaves no lock behind, even when
//! the request reaches the server after the caller gave up.

use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::{LockBackend, LockOptions};

use crate::support::{
    abandon_once_kept, locker_through, prefix, proxy_to, redis, released, until_drawn, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_in_flight_acquire_leaves_no_lock() {
    let server = redis().await;
    let prefix = prefix("abandoned");
    let proxy = proxy_to(&server).await;
    let a = locker_through(&proxy, &prefix, Duration::from_secs(10)).await;
    let long = LockOptions::new().with_ttl(Duration::from_secs(60));

    proxy.hold_requests();
    abandon_once_kept(&proxy, a.lock("job", &long)).await;
    // Now it arrives and takes the lock for a minute; the cleanup sent behind it (kept
    // too, or sent after) must remove it again. The proxy opens only once the attempt
    // has been applied (its INCR drew token 1): a cleanup sent after could otherwise
    // overtake the late delivery.
    proxy.deliver_held();
    until_drawn(&server, &[format!("{prefix}:token:job")]).await;
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
