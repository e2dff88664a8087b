//! `EtcdLocker::close` revokes every session's lease, including sessions retired since
//! (a `lock()` dropped while its join was in flight retires its session, which the locker
//! then no longer hands out): their guards report the loss and their locks are free.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{TwoPaths, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_frees_the_locks_of_retired_sessions_too() {
    let cluster = etcd().await;
    let ns = namespace("close-retired");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(1)).await;
    let other = locker(&cluster, &ns).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let held = client.lock("y", &options).await.expect("lock");
    let first = client
        .session(Duration::from_secs(30))
        .await
        .expect("session")
        .lease_id();

    // Path a keeps the join of "x" (the client's connection through a breaks, b refuses):
    // the call is dropped the moment a keeps its join, and the session (the one holding
    // "y") is retired. (The drop waits for the proxy's event, not for a timer: CI once
    // dropped the call after a fixed 300 ms, before a loaded machine had sent the join.)
    paths.hold_next_request_on_a();
    let call = client.lock("x", &options);
    let answered = within(Duration::from_secs(10), "a keeps the join", async {
        tokio::select! {
            biased;
            () = paths.a.requests_held(1) => None,
            outcome = call => Some(outcome),
        }
    })
    .await;
    assert_eq!(paths.a.held_requests(), 1, "the join is kept");
    assert!(
        !matches!(answered, Some(Ok(_))),
        "the join got through although it was kept"
    );

    paths.b.heal();
    let now = client
        .session(Duration::from_secs(30))
        .await
        .expect("a session through b")
        .lease_id();
    assert_ne!(
        first, now,
        "the session whose join was dropped in flight is retired"
    );
    client.close().await.expect("close");
    assert_eq!(
        within(Duration::from_secs(5), "the guard hears", held.lost()).await,
        LossReason::Closed
    );
    assert!(!held.is_held());
    let taken = other.try_lock("y", &options).await.expect("try_lock");
    assert!(taken.is_some(), "the lock is free once the client closed");
}
