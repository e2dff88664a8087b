//! A waiting `lock_all` subscribes to every lock's release channel at once: one round
//! trip for the set, not one per lock. Before, the waiter subscribed to each channel in
//! turn, each `SUBSCRIBE` awaited before the next: on a link of 300 ms each way, 16 locks
//! cost about ten seconds of subscribing, during which the waiter neither retried nor was
//! registered anywhere (its wait of 6 s ran out first).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard};
use tokio::time::Instant;

use crate::support::{
    Monitor, PROMPT, locker, long_held, prefix, redis, released, slow_sleepy_locker, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribes_to_every_channel_in_one_round_trip() {
    let server = redis().await;
    let prefix = prefix("all-subscribe");
    let holder = locker(&server, &prefix).await;
    let (_proxy, waiter_locks) = slow_sleepy_locker(&server, &prefix).await;
    let names: Vec<String> = (0..16).map(|i| format!("n{i:02}")).collect();
    let held = holder.lock(&names[7], &long_held()).await.expect("n07");
    let mut commands = Monitor::start(&server).await;

    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let options = long_held().with_wait_timeout(Duration::from_secs(6));
        waiter_locks.lock_all(&names, &options).await
    });
    // The waiter's first attempt (the script call naming n00's key; the holder's requests
    // name only n07's) finds n07 held: released now, before the waiter subscribed, so no
    // message tells it. It must subscribe and try again at once.
    let first_key = format!("\"{prefix}:lock:n00\"");
    loop {
        let line = commands.next("the waiter's first attempt").await;
        if line.contains("\"EVALSHA\"") && line.contains(&first_key) {
            break;
        }
    }
    released(held.release().await);

    let all = within(PROMPT, "lock_all answers", waiter)
        .await
        .expect("task")
        .expect("granted within its 6 s wait");
    // Its first attempt, opening the pub/sub connection, subscribing, the attempt after:
    // about four round trips of 600 ms.
    let took = started.elapsed();
    eprintln!("granted after {took:?}");
    assert!(took < Duration::from_secs(4), "granted after {took:?}");
    released(all.release().await);
}
