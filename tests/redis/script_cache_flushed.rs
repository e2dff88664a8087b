//! A server that lost its scripts (a restart, a failover, `SCRIPT FLUSH`) answers a
//! script call with `NOSCRIPT`: every call loads its script and is sent again, so that
//! releases, a semaphore's and several locks' acquisitions, a waiter's registration,
//! a token's advance and `break` all still do what they say (`script_call.rs`).

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use redis::aio::MultiplexedConnection;

use crate::support::{
    direct, exists, locker, long_held, prefix, redis, released, until_waiters, within,
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
    released(guard.release().await);
    assert!(!exists(&mut conn, &key).await, "the released key is gone");

    // A semaphore's acquisition is one script call.
    let semaphore = locker.semaphore("pool", 2).expect("semaphore");
    flush_scripts(&mut conn).await;
    let permit = semaphore.acquire(&options).await.expect("permit");
    released(permit.release().await);

    // So is taking several locks at once.
    flush_scripts(&mut conn).await;
    let both = locker
        .try_lock_all(&["left", "right"], &options)
        .await
        .expect("try_lock_all")
        .expect("both free");
    released(both.release().await);

    // A waiter registers with one (after its first refusal, once subscribed), and the
    // holder's release wakes it.
    let holder = locker.lock("gate", &long_held()).await.expect("lock");
    flush_scripts(&mut conn).await;
    let waiting = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("gate", &LockOptions::new()).await })
    };
    until_waiters(&mut conn, &format!("{prefix}:waiters:gate"), 1).await;
    flush_scripts(&mut conn).await;
    released(holder.release().await);
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
    let after = locker.lock("ledger", &options).await.expect("lock");
    assert!(
        after.token() > seen,
        "{:?} after {seen:?}: above every token handed out",
        after.token()
    );
    released(after.release().await);

    // `break` ends the holder it read.
    let stuck = locker.lock("stuck", &long_held()).await.expect("lock");
    flush_scripts(&mut conn).await;
    assert!(
        locker
            .break_holder("stuck", stuck.owner())
            .await
            .expect("break")
    );
    assert!(
        !exists(&mut conn, stuck.key()).await,
        "the broken key is gone"
    );
}
