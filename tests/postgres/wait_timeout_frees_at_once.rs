//! An advisory-lock wait that times out leaves the lock free when the call returns, even
//! when the server granted the waiting query the lock just before the cancel reached it:
//! PostgreSQL hands a released lock to its first waiter at once, and a session-level
//! advisory lock outlives the cancelled statement.
//!
//! The fault, made certain: the waiting backend is stopped (SIGSTOP) while the holder
//! releases, so the grant lands on it and the cancel cannot.

use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_free_once_a_timed_out_wait_returns() {
    let db = Db::start().await;
    let connect = || async {
        let locks = PgAdvisoryLocker::connect(&db.server.connection_string(&db.name))
            .await
            .expect("connect");
        locks.ensure_schema().await.expect("schema");
        locks
    };
    let (a, b) = (connect().await, connect().await);
    let options = LockOptions::new();
    let held = a.lock("report", &options).await.expect("lock");
    let mut waiting = tokio::spawn({
        let options = options
            .clone()
            .with_wait_timeout(Duration::from_millis(300));
        async move { b.lock("report", &options).await.map(drop) }
    });

    // The waiting backend, as the server lists it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let waiter: i32 = loop {
        let rows = db
            .client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory'",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        if let Some(row) = rows.first() {
            break row.get(0);
        }
        assert!(tokio::time::Instant::now() < deadline, "no waiter appeared");
        // The server announces no event when a backend starts waiting.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // SAFETY: kill(2) of the PostgreSQL backend this test's server runs.
    unsafe {
        libc::kill(waiter, libc::SIGSTOP);
    }
    // The release grants the lock to the stopped backend.
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    // Its wait times out now. While the backend cannot answer, the call must not return
    // (the lock it may hold is not known to be free); if it does, the lock must be free.
    let c = connect().await;
    let early = tokio::time::timeout(Duration::from_secs(1), &mut waiting).await;
    let taken_by_the_abandoned_wait = match &early {
        Ok(_) => match c.try_lock("report", &options).await.expect("try_lock") {
            Some(guard) => {
                let _ = guard.release().await;
                false
            }
            None => true,
        },
        Err(_) => false,
    };
    // SAFETY: as above.
    unsafe {
        libc::kill(waiter, libc::SIGCONT);
    }
    assert!(
        !taken_by_the_abandoned_wait,
        "the timed-out wait returned while its backend held the lock"
    );
    let answer = match early {
        Ok(answer) => answer,
        Err(_) => waiting.await,
    };
    match answer.expect("task") {
        Err(err) if err.is_wait_timeout() => {}
        other => panic!("expected a wait timeout, got {other:?}"),
    }

    let next = c
        .try_lock("report", &options)
        .await
        .expect("try_lock")
        .expect("the abandoned wait left the lock free");
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
