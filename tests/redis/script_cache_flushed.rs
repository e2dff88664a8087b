//! A server that lost its scripts (a restart, a failover, `SCRIPT FLUSH`) answers a
//! script call with `NOSCRIPT`: every call loads its script and is sent again, so that
//! releases, a semaphore's and several locks' acquisitions, a waiter's registration,
//! a token's advance, renewals and `break` all still do what they say (`script_call.rs`), each
//! after loading its script again (the server's own count of `SCRIPT LOAD`s says so).

use std::future::Future;
use std::time::Duration;

use fencelock::testkit::RedisServer;
use fencelock::{LockBackend, LockGuard, LockOptions};
use redis::aio::MultiplexedConnection;

use crate::support::{
    direct, exists, locker, long_held, prefix, redis, released, sleepy_locker, until_waiters,
    within,
};

/// Empties the server's script cache, as a restart or a failover to a replica that never
/// saw the scripts does.
async fn flush_scripts(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(conn)
        .await
        .expect("SCRIPT FLUSH");
}

/// How many `SCRIPT LOAD`s the server ran (its `INFO commandstats`).
async fn script_loads(server: &RedisServer) -> u64 {
    server
        .command_calls("script|load")
        .await
        .expect("INFO commandstats")
}

/// Runs `step` and asserts that it loaded a script again.
async fn reloads<T>(server: &RedisServer, what: &str, step: impl Future<Output = T>) -> T {
    let before = script_loads(server).await;
    let out = step.await;
    assert!(
        script_loads(server).await > before,
        "{what}: answered NOSCRIPT, it loads its script and calls again"
    );
    out
}

#[tokio::test]
async fn every_script_call_loads_its_script_again_after_the_server_lost_them() {
    let server = redis().await;
    let prefix = prefix("script-flush");
    let locker = locker(&server, &prefix).await;
    let mut conn = direct(&server).await;
    let options = LockOptions::new();

    // A release (compare-and-delete): the key is gone, not left to its TTL.
    let guard = locker.lock("door", &options).await.expect("lock");
    let key = guard.key().to_owned();
    flush_scripts(&mut conn).await;
    released(reloads(&server, "a release", guard.release()).await);
    assert!(!exists(&mut conn, &key).await, "the released key is gone");

    // A semaphore's acquisition is one script call.
    let semaphore = locker.semaphore("pool", 2).expect("semaphore");
    flush_scripts(&mut conn).await;
    let permit = reloads(&server, "a permit", semaphore.acquire(&options))
        .await
        .expect("permit");
    released(permit.release().await);

    // So is taking several locks at once.
    flush_scripts(&mut conn).await;
    let both = reloads(
        &server,
        "lock_all",
        locker.try_lock_all(&["left", "right"], &options),
    )
    .await
    .expect("try_lock_all")
    .expect("both free");
    released(both.release().await);

    // A waiter registers with one (after its first refusal, once subscribed), and the
    // holder's release, another, wakes it: a waiter that sleeps a minute without a
    // release message takes the lock at once.
    let holder = locker.lock("gate", &long_held()).await.expect("lock");
    let waiter = sleepy_locker(&server, &prefix).await;
    let before = script_loads(&server).await;
    flush_scripts(&mut conn).await;
    let waiting = tokio::spawn(async move { waiter.lock("gate", &LockOptions::new()).await });
    until_waiters(&mut conn, &format!("{prefix}:waiters:gate"), 1).await;
    assert!(
        script_loads(&server).await > before,
        "the registration loaded its script"
    );
    flush_scripts(&mut conn).await;
    released(reloads(&server, "the holder's release", holder.release()).await);
    let next = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .expect("join")
        .expect("lock");
    released(next.release().await);

    // A grant whose token went backwards (the counter lost: evicted, flushed) moves the
    // counter above the last token seen, in one script call.
    let before = locker.lock("ledger", &options).await.expect("lock");
    let seen = before.token();
    released(before.release().await);
    let () = redis::cmd("DEL")
        .arg(format!("{prefix}:token:ledger"))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    flush_scripts(&mut conn).await;
    let after = reloads(
        &server,
        "a token's advance",
        locker.lock("ledger", &options),
    )
    .await
    .expect("lock");
    assert!(
        after.token() > seen,
        "{:?} after {seen:?}: above every token handed out",
        after.token()
    );
    released(after.release().await);

    // A renewal (a pipeline of script calls) keeps its lock past the TTL.
    let ttl = Duration::from_millis(600);
    let renewed = locker
        .lock("lease", &LockOptions::new().with_ttl(ttl))
        .await
        .expect("lock");
    // Counted before the flush: a renewal due at once (an answer that came late) may
    // reload between the flush and a count after it.
    let before = script_loads(&server).await;
    flush_scripts(&mut conn).await;
    let flushed = tokio::time::Instant::now();
    within(
        Duration::from_secs(5),
        "a renewal reloads its script",
        async {
            while script_loads(&server).await == before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    // What is asserted is that the lock outlives its TTL counted from the flush.
    tokio::time::sleep_until(flushed + ttl * 2).await;
    assert!(renewed.is_held(), "renewed through the flush");
    assert!(
        exists(&mut conn, renewed.key()).await,
        "its key is still there"
    );
    released(renewed.release().await);

    // `break` ends the holder it read.
    let stuck = locker.lock("stuck", &long_held()).await.expect("lock");
    flush_scripts(&mut conn).await;
    let broken = reloads(
        &server,
        "break",
        locker.break_holder("stuck", stuck.owner()),
    )
    .await;
    assert!(broken.expect("break"), "the holder was broken");
    assert!(
        !exists(&mut conn, stuck.key()).await,
        "the broken key is gone"
    );
}
