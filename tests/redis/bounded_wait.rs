//! Every step of a Redis acquisition is bounded: by the wait timeout, and (opening and
//! using the pub/sub connection) by the connect and request timeouts, so that a
//! half-open connection costs a waiter seconds, never the kernel's ~15 minutes.

use std::time::Duration;

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::{LockBackend, LockOptions};
use tokio::time::Instant;

use crate::support::{locker, prefix, proxy_to, redis, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_connection_cannot_stretch_a_wait_timeout() {
    let server = redis().await;
    let prefix = prefix("bounded-wait");
    let proxy = proxy_to(&server).await;
    let holder = locker(&server, &prefix).await;
    // Requests may take 10 s: only the wait timeout can bound the call.
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_secs(10));
    let waiter = RedisLocker::connect(config).await.expect("connect");
    let held = holder.lock("job", &LockOptions::new()).await.expect("lock");

    proxy.pause();
    let started = Instant::now();
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(1));
    let err = within(
        Duration::from_secs(15),
        "lock returns",
        waiter.lock("job", &options),
    )
    .await
    .expect_err("the lock is held");
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(
        took < Duration::from_millis(1500),
        "a 1 s wait took {took:?}"
    );
    proxy.resume();
    released(fencelock::LockGuard::release(held).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_pubsub_connection_hangs_still_gets_the_lock() {
    let server = redis().await;
    let prefix = prefix("bounded-subscribe");
    let proxy = proxy_to(&server).await;
    let holder = locker(&server, &prefix).await;
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(&prefix)
        .with_connect_timeout(Duration::from_millis(500))
        .with_request_timeout(Duration::from_millis(500))
        .with_max_wait_sleep(Duration::from_millis(200));
    let waiter = RedisLocker::connect(config).await.expect("connect");
    let held = holder.lock("job", &LockOptions::new()).await.expect("lock");

    // The waiter's command connection works; the pub/sub connection it opens to wait
    // hangs (accepted, never answered).
    proxy.hold_new_connections();
    let waiting = tokio::spawn(async move { waiter.lock("job", &LockOptions::new()).await });
    // Its attempt found the lock held, and it opened the pub/sub connection to wait.
    within(
        Duration::from_secs(5),
        "pub/sub connection",
        proxy.accepted(2),
    )
    .await;
    released(fencelock::LockGuard::release(held).await);
    let guard = within(Duration::from_secs(5), "the waiter gets the lock", waiting)
        .await
        .expect("task")
        .expect("lock");
    proxy.resume();
    released(fencelock::LockGuard::release(guard).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_cut_short_by_the_wait_timeout_leaves_no_key_behind() {
    let server = redis().await;
    let prefix = prefix("bounded-cut-short");
    let proxy = proxy_to(&server).await;
    let config = RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(&prefix)
        .with_request_timeout(Duration::from_secs(10));
    let waiter = RedisLocker::connect(config).await.expect("connect");
    let other = locker(&server, &prefix).await;

    // The lock is free; the waiter's attempt is in flight (held by the paused link) when
    // its wait times out, and lands once the link resumes.
    proxy.pause();
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait_timeout(Duration::from_millis(300));
    let err = within(
        Duration::from_secs(5),
        "lock returns",
        waiter.lock("job", &options),
    )
    .await
    .expect_err("cut short");
    assert!(err.is_wait_timeout() || err.is_timeout(), "{err}");
    proxy.resume();

    // The late SET's key is cleaned up behind it: nobody's lock for 30 s it is not.
    let wait = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
    let guard = within(
        Duration::from_secs(10),
        "the other client's lock",
        other.lock("job", &wait),
    )
    .await
    .expect("the lock is free again within seconds, not the late key's 30 s TTL");
    released(fencelock::LockGuard::release(guard).await);
}
