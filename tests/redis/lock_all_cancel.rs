//! A `lock_all` on Redis that is dropped while it waits, that times out, or that is
//! abandoned with its attempt in flight (the attempt applied after the caller gave up)
//! leaves no lock key and no waiter's registration behind.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{
    abandon_once_kept, direct, exists, locker, locker_through, long_held, owner_part, prefix,
    proxy_to, redis, released, sleepy_locker, until_drawn, until_waiters, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_timed_out_wait_leaves_nothing() {
    let server = redis().await;
    let prefix = prefix("all-gives-up");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let b_waiters = format!("{prefix}:waiters:b");
    let b = holder.lock("b", &long_held()).await.expect("b");

    // Dropped while it waits (registered in b's set).
    let dropped = {
        let locks = waiter_locks.clone();
        tokio::spawn(async move { locks.lock_all(&["a", "b"], &long_held()).await })
    };
    until_waiters(&mut conn, &b_waiters, 1).await;
    dropped.abort();
    assert!(dropped.await.is_err_and(|err| err.is_cancelled()));
    until_waiters(&mut conn, &b_waiters, 0).await;

    // Timed out.
    let timed_out = waiter_locks
        .lock_all(
            &["a", "b"],
            &long_held().with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(&timed_out, Err(err) if err.is_wait_timeout()),
        "{timed_out:?}"
    );
    until_waiters(&mut conn, &b_waiters, 0).await;

    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);
    assert!(!exists(&mut conn, &format!("{prefix}:waiters:a")).await);
    let stored: Option<String> = redis::cmd("GET")
        .arg(b.key())
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(
        owner_part(stored.as_deref()),
        Some(b.owner()),
        "b untouched"
    );
    assert_eq!(waiter_locks.held_locks(), 0);
    released(b.release().await);
    assert!(!exists(&mut conn, &b_waiters).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_in_flight_lock_all_leaves_no_lock() {
    let server = redis().await;
    let prefix = prefix("all-abandoned");
    let proxy = proxy_to(&server).await;
    let abandoning = locker_through(&proxy, &prefix, Duration::from_secs(10)).await;

    // The script call is written and kept by the proxy; the caller gives up on it there.
    proxy.hold_requests();
    let options = long_held();
    abandon_once_kept(&proxy, abandoning.lock_all(&["a", "b", "c"], &options)).await;
    // Now it arrives and takes every lock for a minute; the cleanup sent behind it must
    // remove them all again. The proxy opens only once the attempt has been applied (each
    // counter drawn), so that a cleanup sent later cannot overtake it.
    proxy.deliver_held();
    let counters: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|name| format!("{prefix}:token:{name}"))
        .collect();
    until_drawn(&server, &counters).await;
    proxy.resume();

    let other = locker(&server, &prefix).await;
    let all = within(
        Duration::from_secs(10),
        "every lock is free, not held by a ghost for a minute",
        other.lock_all(
            &["c", "b", "a"],
            &LockOptions::new().with_wait_timeout(Duration::from_secs(8)),
        ),
    )
    .await
    .expect("lock_all");
    released(all.release().await);
}
