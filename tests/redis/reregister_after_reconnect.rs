//! A waiter registers again after its pub/sub connection was replaced: the loss may have
//! come with the server's data (a restart, a failover to a replica that never saw the
//! registration), and a release publishes only while the waiters' set holds someone.
//! Here the set is emptied and the pub/sub connection killed while the waiter's own
//! connection for requests stays up (so no failed request tells it): woken by the new
//! connection, its next refusal registers again, and the release wakes it.
//!
//! Before, a waiter whose registration was younger than `max_wait_sleep` did not
//! register again (nothing told it), the release published for no one, and it slept its
//! whole `max_wait_sleep` (here a minute).

use fencelock::{LockBackend, LockGuard};
use redis::aio::MultiplexedConnection;

use crate::support::{
    PROMPT, direct, locker, long_held, prefix, redis, released, sleepy_locker, until_waiters,
    within,
};

async fn subscribers(conn: &mut MultiplexedConnection, channel: &str) -> u64 {
    let (_, count): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .expect("PUBSUB NUMSUB");
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_registers_again_after_a_new_pubsub_connection() {
    let server = redis().await;
    let prefix = prefix("reregister");
    let holder = locker(&server, &prefix).await;
    let held = holder.lock("job", &long_held()).await.expect("lock");
    let waiters_key = format!("{prefix}:waiters:job");
    let channel = format!("{prefix}:released:job");
    let mut conn = direct(&server).await;
    // A waiter that sleeps a minute between attempts without a message.
    let waiting = sleepy_locker(&server, &prefix).await;
    let waiter = tokio::spawn(async move { waiting.lock("job", &long_held()).await });
    until_waiters(&mut conn, &waiters_key, 1).await;
    // What a restart does to it, but for its request connection: the registration gone,
    // the pub/sub connection lost.
    redis::cmd("DEL")
        .arg(&waiters_key)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEL");
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    // Subscribed again and woken, its next refusal registers it again.
    until_waiters(&mut conn, &waiters_key, 1).await;
    assert_eq!(subscribers(&mut conn, &channel).await, 1);
    released(held.release().await);
    let guard = within(PROMPT, "woken by the release", waiter)
        .await
        .expect("task")
        .expect("lock");
    released(guard.release().await);
}
