//! A release publishes on the lock's channel only while a waiter is registered in the
//! lock's waiters' set (issue 38), and no waiter is left asleep by that: one registered
//! before the release is woken by it, one whose registration reaches the server after the
//! release finds the lock free, and many rounds of contention end with every waiter
//! served promptly. A waiter that gives up leaves the set; no key is left behind.
//!
//! Every waiter here sleeps a minute between attempts without a message (and the locks
//! have a minute's TTL), so a missed wake-up shows as a wait of a minute, far past the
//! bounds the tests allow.

use std::time::Duration;

use fencelock::redis::{RedisLocker, RedisSemaphore};
use fencelock::{LockBackend, LockGuard};

use crate::support::{
    LONG, Listener, Monitor, PROMPT, client_of, direct, exists, locker, long_held, prefix,
    proxy_to, redis, released, sleepy_locker, slow_sleepy_locker, until_waiters, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_waiters_publishes_nothing() {
    let server = redis().await;
    let prefix = prefix("no-waiter");
    let locks = locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let mut listener = Listener::new(&server, &format!("{prefix}:released:door")).await;

    for _ in 0..3 {
        let guard = locks.lock("door", &long_held()).await.expect("lock");
        released(guard.release().await);
    }
    let semaphore = locks.semaphore("pool", 2).expect("semaphore");
    let mut permits = Listener::new(&server, &format!("{prefix}:permit-released:pool")).await;
    released(
        semaphore
            .acquire(&long_held())
            .await
            .expect("permit")
            .release()
            .await,
    );

    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
    assert_eq!(permits.published(&mut conn).await, Vec::<String>::new());
    assert!(!exists(&mut conn, &format!("{prefix}:waiters:door")).await);
    assert!(!exists(&mut conn, &format!("{prefix}:permit-waiters:pool")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_waiter_is_woken_by_the_release() {
    let server = redis().await;
    let prefix = prefix("woken");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let waiters_key = format!("{prefix}:waiters:door");
    let mut listener = Listener::new(&server, &format!("{prefix}:released:door")).await;

    let held = holder.lock("door", &long_held()).await.expect("lock");
    let waiter = tokio::spawn(async move { waiter_locks.lock("door", &long_held()).await });
    // The waiter's attempt failed and it is registered: the release comes after.
    until_waiters(&mut conn, &waiters_key, 1).await;
    // Its registration outlives the set's expiry never: nothing is left forever.
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&waiters_key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(pttl > 0, "the waiters' set expires (PTTL {pttl})");
    released(held.release().await);

    let guard = within(PROMPT, "woken by the release", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert_eq!(listener.published(&mut conn).await, vec!["released"]);
    // The holder that waited is unregistered by its release, which then has no one to
    // tell.
    released(guard.release().await);
    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
    assert!(!exists(&mut conn, &waiters_key).await, "no key left");
}

/// What the holder's release waits for in [`released_while_the_waiter_looks`]: the
/// waiter's subscribed attempt refused by the server (its registration, sent next, then
/// reaches the server after the release), or the waiter's first request after that
/// refusal (which, with the fix, registers it in the same step as it finds the lock held).
#[derive(Clone, Copy, Debug)]
enum ReleaseAfter {
    Refusal,
    NextRequest,
}

/// A waiter that reaches Redis through a proxy delaying every chunk by 300 ms each way
/// (so that each of its requests reaches the server at least 600 ms after the one before
/// was answered) waits for a lock held by a direct client; the holder releases the moment
/// MONITOR shows the waiter's request `after` (its 1 ms release lands well inside the
/// 600 ms before the waiter's next request). The waiter must hold the lock promptly:
/// it sleeps a minute if it missed the release.
async fn released_while_the_waiter_looks(after: ReleaseAfter) {
    let server = redis().await;
    let prefix = prefix("race");
    let holder = locker(&server, &prefix).await;
    let (_proxy, waiter_locks) = slow_sleepy_locker(&server, &prefix).await;

    let held = holder.lock("door", &long_held()).await.expect("lock");
    let mut commands = Monitor::start(&server).await;
    let waiter = tokio::spawn(async move { waiter_locks.lock("door", &long_held()).await });

    // The waiter tries, subscribes, tries again (subscribed): its second `SET` is the
    // refusal after which it registers.
    let mut sets = 0;
    let waiter_client = loop {
        let line = commands.next("the waiter's attempts").await;
        if line.contains("\"SET\"") {
            sets += 1;
            if sets == 2 {
                break client_of(&line);
            }
        }
    };
    if let ReleaseAfter::NextRequest = after {
        loop {
            let line = commands.next("the waiter's next request").await;
            if client_of(&line) == waiter_client && !line.contains("\"INCR\"") {
                break;
            }
        }
    }
    released(held.release().await);

    let guard = within(PROMPT, "the waiter holds the lock", waiter)
        .await
        .expect("task")
        .expect("lock");
    released(guard.release().await);
    let mut conn = direct(&server).await;
    assert!(!exists(&mut conn, &format!("{prefix}:waiters:door")).await);
}

/// (A registration that does not look at the lock in the same step, registering and then
/// sleeping although the lock went meanwhile, sleeps here the whole minute; an attempt
/// that does not register at all passes this one and fails the next.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_registration_comes_after_the_release_finds_the_lock_free() {
    released_while_the_waiter_looks(ReleaseAfter::Refusal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_just_after_the_waiter_found_the_lock_held_wakes_it() {
    released_while_the_waiter_looks(ReleaseAfter::NextRequest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_rounds_leave_no_waiter_asleep() {
    const TASKS: usize = 8;
    const ROUNDS: usize = 25;
    let server = redis().await;
    let prefix = prefix("rounds");
    let lockers = [
        sleepy_locker(&server, &prefix).await,
        sleepy_locker(&server, &prefix).await,
    ];
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let locks = lockers[task % 2].clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                // Eight tasks, each holding briefly: a wait much past a few holds means
                // a missed wake-up (the waiter would sleep a minute).
                let guard = within(
                    Duration::from_secs(5),
                    "a contended lock",
                    locks.lock("door", &long_held()),
                )
                .await
                .expect("lock");
                tokio::task::yield_now().await;
                released(guard.release().await);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let mut conn = direct(&server).await;
    assert!(!exists(&mut conn, &format!("{prefix}:waiters:door")).await);
    assert!(!exists(&mut conn, &format!("{prefix}:lock:door")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_waiters_set() {
    let server = redis().await;
    let prefix = prefix("gives-up");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let waiters_key = format!("{prefix}:waiters:door");
    let mut listener = Listener::new(&server, &format!("{prefix}:released:door")).await;
    let held = holder.lock("door", &long_held()).await.expect("lock");

    // Dropped while it waits.
    let dropped = {
        let locks = waiter_locks.clone();
        tokio::spawn(async move { locks.lock("door", &long_held()).await })
    };
    until_waiters(&mut conn, &waiters_key, 1).await;
    dropped.abort();
    assert!(dropped.await.is_err_and(|err| err.is_cancelled()));
    until_waiters(&mut conn, &waiters_key, 0).await;

    // Timed out.
    let timed_out = waiter_locks
        .lock(
            "door",
            &long_held().with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(timed_out.is_err_and(|err| err.is_wait_timeout()));
    until_waiters(&mut conn, &waiters_key, 0).await;

    released(held.release().await);
    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
    assert!(!exists(&mut conn, &waiters_key).await, "no key left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_died_is_dropped_from_the_set_once_its_registration_expires() {
    let server = redis().await;
    let prefix = prefix("died");
    let holder = locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let waiters_key = format!("{prefix}:waiters:door");
    let mut listener = Listener::new(&server, &format!("{prefix}:released:door")).await;
    let held = holder.lock("door", &long_held()).await.expect("lock");
    // A waiter that crashed: registered, expired a second ago, never unregistered.
    let now: (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let expired = now.0 * 1000 - 1000;
    redis::cmd("ZADD")
        .arg(&waiters_key)
        .arg(expired)
        .arg("crashed-waiter")
        .query_async::<u64>(&mut conn)
        .await
        .expect("ZADD");

    released(held.release().await);
    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
    assert!(
        !exists(&mut conn, &waiters_key).await,
        "pruned by the release"
    );
}

/// The release script's wake decision, case by case (its one `TYPE` of the set serves
/// both the holder's own unregistering and the decision): a holder that waited and is
/// the set's last member publishes nothing; one that leaves another live waiter behind
/// publishes; a key of another type under the set's name is left alone and the release
/// publishes, unsure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_waited_publishes_only_for_the_waiters_it_leaves() {
    let server = redis().await;
    let prefix = prefix("holder-waited");
    let holder = locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let waiters_key = format!("{prefix}:waiters:door");
    let mut listener = Listener::new(&server, &format!("{prefix}:released:door")).await;
    let held = holder.lock("door", &long_held()).await.expect("lock");
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let locks = sleepy_locker(&server, &prefix).await;
        waiters.spawn(async move { locks.lock("door", &long_held()).await });
    }
    until_waiters(&mut conn, &waiters_key, 2).await;

    // Two registered: the release publishes; one of them takes the lock and stays
    // registered until its own release, the other stays registered too.
    released(held.release().await);
    let winner = within(PROMPT, "a waiter is woken", waiters.join_next())
        .await
        .expect("a waiter")
        .expect("task")
        .expect("lock");
    assert_eq!(listener.published(&mut conn).await, vec!["released"]);
    // The winner's release leaves the other waiter behind: it publishes.
    released(winner.release().await);
    let last = within(
        PROMPT,
        "the waiter left behind is woken",
        waiters.join_next(),
    )
    .await
    .expect("the other waiter")
    .expect("task")
    .expect("lock");
    assert_eq!(listener.published(&mut conn).await, vec!["released"]);
    // The last holder waited too, and is the set's last member: nothing to wake.
    released(last.release().await);
    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
    assert!(
        !exists(&mut conn, &waiters_key).await,
        "the set went with its last member"
    );

    // A key of another type where the set would be: left alone, and a release publishes.
    redis::cmd("HSET")
        .arg(&waiters_key)
        .arg("field")
        .arg("value")
        .query_async::<u64>(&mut conn)
        .await
        .expect("HSET");
    let guard = holder.lock("door", &long_held()).await.expect("lock");
    released(guard.release().await);
    assert_eq!(listener.published(&mut conn).await, vec!["released"]);
    let kind: String = redis::cmd("TYPE")
        .arg(&waiters_key)
        .query_async(&mut conn)
        .await
        .expect("TYPE");
    assert_eq!(kind, "hash", "another type's key is not ours to change");
    redis::cmd("DEL")
        .arg(&waiters_key)
        .query_async::<u64>(&mut conn)
        .await
        .expect("DEL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_release_that_always_publishes_still_wakes_a_new_waiter() {
    let server = redis().await;
    let prefix = prefix("old-release");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let held = holder.lock("door", &long_held()).await.expect("lock");
    let key = held.key().to_owned();
    let waiter = tokio::spawn(async move { waiter_locks.lock("door", &long_held()).await });
    until_waiters(&mut conn, &format!("{prefix}:waiters:door"), 1).await;
    // What a release by fencelock before issue 38 did: delete, publish, whoever waits.
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<u64>(&mut conn)
        .await
        .expect("DEL");
    redis::cmd("PUBLISH")
        .arg(format!("{prefix}:released:door"))
        .arg("released")
        .query_async::<u64>(&mut conn)
        .await
        .expect("PUBLISH");
    let guard = within(PROMPT, "woken by the old release", waiter)
        .await
        .expect("task")
        .expect("lock");
    released(guard.release().await);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_registers_with_its_refused_attempt_and_is_woken() {
    let server = redis().await;
    let prefix = prefix("semaphore-wait");
    // Two permits: the acquire script's path (one permit takes a lock's).
    let semaphore =
        |locks: &RedisLocker| -> RedisSemaphore { locks.semaphore("pool", 2).expect("semaphore") };
    let holder = semaphore(&locker(&server, &prefix).await);
    let waiter = semaphore(&sleepy_locker(&server, &prefix).await);
    let mut conn = direct(&server).await;
    let waiters_key = format!("{prefix}:permit-waiters:pool");
    let mut listener = Listener::new(&server, &format!("{prefix}:permit-released:pool")).await;

    let first = holder.acquire(&long_held()).await.expect("permit");
    let second = holder.acquire(&long_held()).await.expect("permit");
    let waiting = tokio::spawn(async move { waiter.acquire(&long_held()).await });
    until_waiters(&mut conn, &waiters_key, 1).await;
    released(first.release().await);
    let permit = within(PROMPT, "woken by the release", waiting)
        .await
        .expect("task")
        .expect("permit");
    assert_eq!(listener.published(&mut conn).await, vec!["released"]);
    // The grant unregistered it, in the acquire script: releases tell no one.
    assert!(!exists(&mut conn, &waiters_key).await);
    released(permit.release().await);
    released(second.release().await);
    assert_eq!(listener.published(&mut conn).await, Vec::<String>::new());
}

/// A waiter cut short (its wait timeout) while the pub/sub connection is still opening
/// leaves no interest behind: the next waiter on that lock subscribes and is woken by the
/// release. (Before the fix the cut-short waiter's interest stayed counted, the next
/// waiter was "not the first" and never subscribed, and it slept its whole minute.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_short_while_subscribing_leaves_the_channel_subscribable() {
    let server = redis().await;
    let prefix = prefix("cut-short");
    let holder = locker(&server, &prefix).await;
    let proxy = proxy_to(&server).await;
    let config = fencelock::redis::RedisConfig::new(format!("redis://{}/", proxy.address()))
        .with_prefix(&prefix)
        .with_connect_timeout(Duration::from_secs(30))
        .with_max_wait_sleep(LONG);
    let waiter_locks = RedisLocker::connect(config).await.expect("connect");
    let held = holder.lock("door", &long_held()).await.expect("lock");

    // The pub/sub connection (opened at the first interest) hangs: the first waiter's
    // subscription is still being set up when its 300 ms run out.
    proxy.hold_new_connections();
    let cut_short = waiter_locks
        .lock(
            "door",
            &long_held().with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(&cut_short, Err(err) if err.is_wait_timeout()),
        "{cut_short:?}"
    );
    proxy.resume();

    let waiter = tokio::spawn({
        let waiter_locks = waiter_locks.clone();
        async move { waiter_locks.lock("door", &long_held()).await }
    });
    let mut conn = direct(&server).await;
    until_waiters(&mut conn, &format!("{prefix}:waiters:door"), 1).await;
    released(held.release().await);
    let guard = within(PROMPT, "the second waiter holds the lock", waiter)
        .await
        .expect("task")
        .expect("lock");
    released(guard.release().await);
}
