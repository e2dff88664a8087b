//! A connection's task ends with the runtime it was spawned on: its socket is dropped and
//! the server frees the session's locks at once. A lock held through that connection
//! from another runtime must read as lost then, not at its heartbeat's next failure (a
//! third of the TTL later) while the next holder already has it; and the locker must not
//! hand out such a connection from its pool as open.

use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::Db;

/// Long, so that the heartbeat (a third of it) cannot be what reports the loss in time.
const TTL: Duration = Duration::from_secs(30);

/// How soon the loss must show once the runtime is gone: far below the heartbeat's 10 s.
const PROMPTLY: Duration = Duration::from_secs(3);

/// Connects on a runtime of its own (one worker thread, which drives the connection's
/// task after `block_on` returns): the locker's pooled connection lives on that runtime.
fn connect_on_own_runtime(connection: String) -> (tokio::runtime::Runtime, PgAdvisoryLocker) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let locks = runtime
            .block_on(async {
                let locks = PgAdvisoryLocker::connect(&connection).await?;
                locks.ensure_schema().await?;
                Ok::<_, fencelock::LockError>(locks)
            })
            .expect("connect");
        (runtime, locks)
    })
    .join()
    .expect("the connecting thread")
}

/// Shuts `runtime` down and waits until its tasks are dropped (on a blocking thread: a
/// runtime may not be dropped in an async context).
async fn end(runtime: tokio::runtime::Runtime) {
    tokio::task::spawn_blocking(move || drop(runtime))
        .await
        .expect("the runtime's shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_connection_runtime_ends_reads_lost_at_once_and_is_freed() {
    let db = Db::start().await;
    let connection = db.server.connection_string(&db.name);
    let (runtime, locks) = connect_on_own_runtime(connection.clone());
    let other = PgAdvisoryLocker::connect(&connection)
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(TTL);

    // Taken on this runtime through the pooled connection, whose task runs on the other.
    let held = locks.lock("job", &options).await.expect("lock");
    assert!(held.is_held());
    end(runtime).await;

    let reason = tokio::time::timeout(PROMPTLY, held.lost())
        .await
        .expect("the closed connection is reported at once, not at the next heartbeat");
    assert_eq!(reason, LossReason::Disconnected);
    assert!(!held.is_held());
    // The server did free it: the next holder gets it while this guard still exists.
    let next = other
        .lock("job", &options.clone().with_wait_timeout(PROMPTLY))
        .await
        .expect("the server freed the lock");
    assert!(next.token() > held.token());
    assert_eq!(held.release().await.ok(), Some(ReleaseOutcome::NotHeld));
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_whose_runtime_ended_is_not_handed_out() {
    let db = Db::start().await;
    let (runtime, locks) = connect_on_own_runtime(db.server.connection_string(&db.name));
    end(runtime).await;
    // The only pooled connection died with its runtime: the lock opens a new one here.
    let options = LockOptions::new().with_ttl(TTL).with_wait_timeout(PROMPTLY);
    let held = locks
        .lock("job", &options)
        .await
        .expect("a lock on a new connection");
    assert!(held.is_held());
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
