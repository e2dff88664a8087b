//! A waiting `lock_all` on Redis is woken by the release of the lock in its way: its
//! refused attempt registers it, in the same step, in the waiters' set of the held lock
//! that expires last (no grant can come before that one is free), and it listens on every
//! lock's release channel. Woken while another lock is still held, its next refusal
//! registers with that one (and leaves the first): no wake-up is lost on the way. Also
//! when the release comes right after a refusal: before the waiter subscribed, or right
//! after its subscribed attempt (the race `publish_only_when_waited.rs` runs for one lock).
//!
//! Every waiter here sleeps a minute between attempts without a message (the locks have a
//! minute's TTL or more): a missed wake-up shows as a wait of a minute, far past what is
//! allowed.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{
    Listener, Monitor, PROMPT, direct, exists, locker, long_held, prefix, redis, released,
    sleepy_locker, slow_sleepy_locker, until_waiters, waiters, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_of_the_lock_in_its_way_wakes_the_waiter() {
    let server = redis().await;
    let prefix = prefix("all-woken");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let mut b_channel = Listener::new(&server, &format!("{prefix}:released:b")).await;
    let mut d_channel = Listener::new(&server, &format!("{prefix}:released:d")).await;
    let ttl = |secs| LockOptions::new().with_ttl(Duration::from_secs(secs));
    // b expires last, then c, then d.
    let b = holder.lock("b", &ttl(180)).await.expect("b");
    let c = holder.lock("c", &ttl(120)).await.expect("c");
    let d = holder.lock("d", &ttl(60)).await.expect("d");
    let set = |name: &str| format!("{prefix}:waiters:{name}");

    let waiter = tokio::spawn(async move {
        waiter_locks
            .lock_all(&["d", "c", "a", "b"], &long_held())
            .await
    });
    // Registered with b alone; nothing taken.
    until_waiters(&mut conn, &set("b"), 1).await;
    for name in ["a", "c", "d"] {
        assert_eq!(waiters(&mut conn, &set(name)).await, 0, "{name}");
    }
    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);

    // d's release publishes nothing: nobody waits for d (the waiter could not be granted
    // with b held).
    released(d.release().await);
    assert_eq!(d_channel.published(&mut conn).await, Vec::<String>::new());

    // b's release wakes it; c still held: it tries again, registers with c and leaves
    // b's set, takes nothing, and waits on.
    released(b.release().await);
    assert_eq!(b_channel.published(&mut conn).await, vec!["released"]);
    until_waiters(&mut conn, &set("c"), 1).await;
    assert_eq!(waiters(&mut conn, &set("b")).await, 0);
    assert!(!waiter.is_finished());
    assert!(!exists(&mut conn, &format!("{prefix}:lock:a")).await);
    assert!(!exists(&mut conn, &format!("{prefix}:lock:b")).await);

    // c's release wakes it again: every lock free, granted.
    released(c.release().await);
    let all = within(PROMPT, "woken by the last release", waiter)
        .await
        .expect("task")
        .expect("lock_all");
    assert_eq!(all.guards().len(), 4);
    // The grant unregistered it everywhere: releases tell no one.
    for name in ["a", "b", "c", "d"] {
        assert!(!exists(&mut conn, &set(name)).await, "{name}");
    }
    released(all.release().await);
    assert_eq!(b_channel.published(&mut conn).await, Vec::<String>::new());
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
