//! A waiting `lock_all` on Redis is woken by the release of any lock of its set: its
//! refused attempt registers it in the waiters' set of every lock it found held, in the
//! same step, and it listens on every lock's release channel. Also when the release comes
//! right after a refusal: before the waiter subscribed, or right after its subscribed
//! attempt (the race `publish_only_when_waited.rs` runs for one lock).
//!
//! Every waiter here sleeps a minute between attempts without a message (the locks have a
//! minute's TTL): a missed wake-up shows as a wait of a minute, far past what is allowed.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard};

use crate::support::{
    Listener, Monitor, PROMPT, direct, exists, locker, long_held, prefix, redis, released,
    sleepy_locker, slow_sleepy_locker, until_waiters, waiters, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_any_held_lock_wakes_the_waiter() {
    let server = redis().await;
    let prefix = prefix("all-woken");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let mut b_channel = Listener::new(&server, &format!("{prefix}:released:b")).await;
    let b = holder.lock("b", &long_held()).await.expect("b");
    let c = holder.lock("c", &long_held()).await.expect("c");

    let waiter =
        tokio::spawn(async move { waiter_locks.lock_all(&["c", "a", "b"], &long_held()).await });
    // Registered where it found a lock held, and only there; nothing taken.
    until_waiters(&mut conn, &format!("{prefix}:waiters:b"), 1).await;
    until_waiters(&mut conn, &format!("{prefix}:waiters:c"), 1).await;
    assert_eq!(waiters(&mut conn, &format!("{prefix}:waiters:a")).await, 0);
    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);

    // b's release wakes it; c still held: it tries again (refreshing its registration
    // in c's set: the sign that it woke), takes nothing, and waits on.
    let c_waiters = format!("{prefix}:waiters:c");
    let registered = registration_expiry(&mut conn, &c_waiters).await;
    released(b.release().await);
    assert_eq!(b_channel.published(&mut conn).await, vec!["released"]);
    within(PROMPT, "the waiter tries again", async {
        while registration_expiry(&mut conn, &c_waiters).await <= registered {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(!waiter.is_finished());
    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);
    assert!(!exists(&mut conn, &format!("{prefix}:lock:b")).await);
    released(c.release().await);

    let all = within(PROMPT, "woken by the last release", waiter)
        .await
        .expect("task")
        .expect("lock_all");
    assert_eq!(all.guards().len(), 3);
    // The grant unregistered it everywhere: releases tell no one.
    for name in ["a", "b", "c"] {
        assert!(
            !exists(&mut conn, &format!("{prefix}:waiters:{name}")).await,
            "{name}"
        );
    }
    released(all.release().await);
    assert_eq!(b_channel.published(&mut conn).await, Vec::<String>::new());
}

/// When the one registration in the waiters' set `key` expires (server ms).
async fn registration_expiry(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> f64 {
    let found: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("ZRANGE");
    assert_eq!(found.len(), 1, "{key}: {found:?}");
    found[0].1
}

/// When the holder's release of `b` lands, relative to the waiter's attempts.
#[derive(Clone, Copy, Debug)]
enum ReleaseAfter {
    /// Its first attempt (not yet subscribed, so not registering) was refused: it must
    /// subscribe and then try again at once.
    FirstRefusal,
    /// Its subscribed attempt was refused, registering it in the same step: the release
    /// must see the registration and publish. (A waiter that registered with a request
    /// of its own after the refusal would be registered after this release, unheard.)
    SubscribedRefusal,
}

/// A waiter that reaches Redis through a proxy delaying every chunk by 300 ms each way
/// waits in `lock_all(a, b)` for `b`, held by a direct client, which releases it the
/// moment MONITOR shows the waiter's attempt `after`: its 1 ms release lands well inside
/// the 600 ms before the waiter's next request could reach the server. The waiter must
/// hold both locks promptly: it sleeps a minute if it missed the release.
async fn released_while_the_waiter_looks(after: ReleaseAfter) {
    let server = redis().await;
    let prefix = prefix("all-race");
    let holder = locker(&server, &prefix).await;
    let (_proxy, waiter_locks) = slow_sleepy_locker(&server, &prefix).await;

    let held = holder.lock("b", &long_held()).await.expect("b");
    let mut commands = Monitor::start(&server).await;
    let waiter =
        tokio::spawn(async move { waiter_locks.lock_all(&["a", "b"], &long_held()).await });

    // The waiter's attempts are its script calls naming `a`'s key (the holder's requests
    // name only `b`'s).
    let wanted = match after {
        ReleaseAfter::FirstRefusal => 1,
        ReleaseAfter::SubscribedRefusal => 2,
    };
    let a_key = format!("\"{prefix}:lock:a\"");
    let mut attempts = 0;
    while attempts < wanted {
        let line = commands.next("the waiter's attempts").await;
        if line.contains("\"EVALSHA\"") && line.contains(&a_key) {
            attempts += 1;
        }
    }
    released(held.release().await);

    let all = within(PROMPT, "the waiter holds both", waiter)
        .await
        .expect("task")
        .expect("lock_all");
    released(all.release().await);
    let mut conn = direct(&server).await;
    assert!(!exists(&mut conn, &format!("{prefix}:waiters:b")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_waiter_subscribed_is_not_missed() {
    released_while_the_waiter_looks(ReleaseAfter::FirstRefusal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_just_after_the_subscribed_refusal_wakes_the_waiter() {
    released_while_the_waiter_looks(ReleaseAfter::SubscribedRefusal).await;
}
