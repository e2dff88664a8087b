//! A waiter sleeps until the release message wakes it: the commands it sends while the
//! lock is held are counted by the server, and there are none beyond its first attempts.

use std::time::Duration;

use crate::support::{Monitor, locker, prefix, redis, released, within};
use fencelock::{LockBackend, LockGuard, LockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_on_the_release_message_without_polling() {
    let server = redis().await;
    let prefix = prefix("wake");
    let holder_locks = locker(&server, &prefix).await;
    // A waiter that would sleep a minute between attempts if no message came.
    let config = server
        .config(&prefix)
        .with_max_wait_sleep(Duration::from_secs(60));
    let waiter_locks = fencelock::redis::RedisLocker::connect(config)
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));

    let held = holder_locks.lock("door", &options).await.expect("lock");
    server.reset_stats().await.expect("reset");
    let mut commands = Monitor::start(&server).await;

    let waiter = {
        let options = options.clone();
        tokio::spawn(async move { waiter_locks.lock("door", &options).await })
    };
    // The waiter tries, subscribes, tries once more (in case of a release in between),
    // then waits: await those two attempts as the server sees them.
    let mut attempts = 0;
    while attempts < 2 {
        let line = commands.next("waiter attempts").await;
        // An attempt is a `SET NX PX` (with its `INCR`, and when refused a `PTTL`, or the
        // script that reads it and registers the waiter, once subscribed).
        if line.contains("\"SET\"") || line.contains("\"set\"") {
            attempts += 1;
        }
    }
    // The lock stays held for a while; a polling waiter would send commands now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    released(held.release().await);

    let guard = within(Duration::from_secs(10), "woken by the message", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(guard.is_held());
    // Waiter: 2 refused attempts (the second, subscribed, registers it: a script) + 1
    // after the message, nothing in between; holder: its release (a script).
    assert_eq!(server.command_calls("set").await.expect("stats"), 3);
    assert_eq!(server.command_calls("evalsha").await.expect("stats"), 2);
    released(guard.release().await);
}
