//! A lost pub/sub connection is replaced, and every channel that still has waiters is
//! subscribed again on the new one, without waiting for a new channel's interest; the
//! waiters are woken once it is (a release while nobody listened is not waited out).
//!
//! Before, a channel whose waiters lived through the loss stayed unsubscribed for as long
//! as some waiter waited on it: later waiters found its subscription "settled", every
//! release still published and nobody heard it, and each handoff cost a whole
//! `max_wait_sleep` (here 10 s) for the life of the process.

use std::sync::Arc;
use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::support::{direct, prefix, within};
use crate::turns::{TASKS, take_turns, until_every_task_is_granted};

/// How long a waiter sleeps without a message: far longer than any bound below.
const SLEEP: Duration = Duration::from_secs(10);

/// How many clients the server counts on `channel` (0 if it cannot be asked: a server
/// restarting).
async fn subscribers(server: &RedisServer, channel: &str) -> u64 {
    let Ok(mut conn) = server.connection().await else {
        return 0;
    };
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async::<(String, u64)>(&mut conn)
        .await
        .map_or(0, |(_, count)| count)
}

/// Waits until the release channel has a subscriber again (polled: the server has no
/// event for it).
async fn until_subscribed(server: &RedisServer, channel: &str, limit: Duration) {
    within(limit, &format!("{channel} subscribed again"), async {
        while subscribers(server, channel).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Three tasks taking turns, their wake-ups working (every task granted twice, the
/// channel subscribed): the server, its channel, the counts and the tasks.
async fn turns_under_way(
    test: &str,
) -> (
    RedisServer,
    String,
    Arc<watch::Sender<[u64; TASKS]>>,
    JoinSet<()>,
) {
    let server = RedisServer::start().await.expect("redis");
    let prefix = prefix(test);
    let locks = RedisLocker::connect(server.config(&prefix).with_max_wait_sleep(SLEEP))
        .await
        .expect("connect");
    let grants = Arc::new(watch::channel([0; TASKS]).0);
    let tasks = take_turns(&locks, &grants);
    let channel = format!("{prefix}:released:job");
    until_subscribed(&server, &channel, Duration::from_secs(10)).await;
    until_every_task_is_granted(&grants, [0; TASKS], 2, SLEEP / 2, "turns before the loss").await;
    (server, channel, grants, tasks)
}

async fn kill_pubsub_clients(conn: &mut MultiplexedConnection) -> u64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT KILL")
}

/// Kills the locker's pub/sub connection while it is subscribed to `channel`. Between
/// turns no task may be waiting (one was just granted, the one that released has not
/// asked again yet): the last interest gone, the connection unsubscribes, and a client
/// with no subscription is not of type pubsub to `CLIENT KILL`, which then kills none;
/// it is killed once it is subscribed again.
async fn kill_the_subscribed_connection(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    channel: &str,
) {
    within(
        Duration::from_secs(10),
        "the pub/sub connection killed",
        async {
            loop {
                until_subscribed(server, channel, Duration::from_secs(3)).await;
                match kill_pubsub_clients(conn).await {
                    0 => continue,
                    killed => {
                        assert_eq!(killed, 1, "one pub/sub client");
                        break;
                    }
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pubsub_connection_is_subscribed_again_for_the_waiters_waiting() {
    let (server, channel, grants, tasks) = turns_under_way("pubsub-kill").await;
    let mut conn = direct(&server).await;
    kill_the_subscribed_connection(&server, &mut conn, &channel).await;
    until_subscribed(&server, &channel, Duration::from_secs(3)).await;
    // Handoffs by release message again: every task is granted twice, well within one
    // sleep of a waiter that nobody wakes.
    let since = *grants.borrow();
    until_every_task_is_granted(
        &grants,
        since,
        2,
        Duration::from_secs(4),
        "every task granted twice after the loss",
    )
    .await;
    drop(tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_is_ridden_out_by_the_waiters_waiting() {
    let (mut server, channel, grants, tasks) = turns_under_way("pubsub-restart").await;
    // Empty, on the same port: the waiters' sets are gone with the rest.
    server.restart().await.expect("restart");
    until_subscribed(&server, &channel, Duration::from_secs(5)).await;
    let since = *grants.borrow();
    until_every_task_is_granted(
        &grants,
        since,
        2,
        Duration::from_secs(4),
        "every task granted twice after the restart",
    )
    .await;
    drop(tasks);
}
