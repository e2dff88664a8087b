//! A refused `lock_all` registers its waiter in the waiters' set of ONE lock it found held
//! (the one that expires last), not of every one: the waiter cannot be granted before that
//! lock is free, its release publishes, and the waiter sleeps no longer than its expiry;
//! woken, its next refusal registers on whichever lock then stands in its way. Before, it
//! registered with every held lock, so every release of any of them published and woke it
//! (one attempt of the whole set each): a set with one lock held for long and others busy
//! was woken by every cycle of the busy ones, undoing "publish only when someone waits"
//! for them (issue 38).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::sync::mpsc;

use crate::support::{
    PROMPT, direct, locker, prefix, redis, released, sleepy_locker, waiters, within,
};

/// Cycles per busy lock once the waiter may be waiting.
const CYCLES: u64 = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_locks_the_waiter_cannot_take_yet_neither_publish_nor_wake_it() {
    let server = redis().await;
    let prefix = prefix("all-one-set");
    let holder = locker(&server, &prefix).await;
    let waiter_locks = sleepy_locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    // z: held throughout, the longest TTL of the set.
    let z = holder
        .lock("z", &LockOptions::new().with_ttl(Duration::from_secs(120)))
        .await
        .expect("z");

    // 15 clients, each taking and releasing its own lock h1..h15 (TTL 10 s): each signals
    // once its first cycle is done, then cycles on.
    let (warm, mut warmed) = mpsc::channel(15);
    let mut cyclers = Vec::new();
    for i in 1..=15 {
        let locks = locker(&server, &prefix).await;
        let warm = warm.clone();
        cyclers.push(tokio::spawn(async move {
            let name = format!("h{i}");
            let options = LockOptions::new().with_ttl(Duration::from_secs(10));
            for cycle in 0..=CYCLES {
                let guard = locks.lock(&name, &options).await.expect("h");
                released(guard.release().await);
                if cycle == 0 {
                    warm.send(()).await.expect("test alive");
                }
            }
        }));
    }
    for _ in 0..15 {
        warmed.recv().await.expect("a cycler warmed up");
    }
    server.reset_stats().await.expect("reset");

    let waiter = tokio::spawn(async move {
        let mut names = vec!["z".to_owned()];
        names.extend((1..=15).map(|i| format!("h{i}")));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let options = LockOptions::new().with_ttl(Duration::from_secs(60));
        waiter_locks.lock_all(&names, &options).await
    });
    for cycler in cyclers {
        within(Duration::from_secs(60), "the cyclers", cycler)
            .await
            .expect("cycler");
    }

    // The waiter's attempts each read the 16 keys and the set it registers in (17 PTTLs
    // in the script); the only other PTTL here is each release's one look at its
    // waiters' set, a release that deletes (each cycler has its lock to itself and is
    // never refused). The cyclers are done: nothing else changes the counts meanwhile.
    let looks = server.command_calls("pttl").await.expect("stats");
    let releases = server.command_calls("del").await.expect("stats");
    let attempts = looks.saturating_sub(releases) / 17;
    let publishes = server.command_calls("publish").await.expect("stats");
    eprintln!(
        "{} cycles: {attempts} waiter attempts, {publishes} publishes",
        15 * CYCLES
    );
    assert!(!waiter.is_finished(), "z is held");
    assert_eq!(
        waiters(&mut conn, &format!("{prefix}:waiters:z")).await,
        1,
        "registered with z"
    );
    assert!(
        (1..=4).contains(&attempts),
        "{attempts} attempts of the set while z was held"
    );
    assert_eq!(publishes, 0, "releases of the busy locks published");

    // The release of the lock in its way wakes it (it sleeps a minute without a message).
    released(z.release().await);
    let all = within(PROMPT, "woken by z's release", waiter)
        .await
        .expect("task")
        .expect("lock_all");
    assert_eq!(all.guards().len(), 16);
    released(all.release().await);
}
