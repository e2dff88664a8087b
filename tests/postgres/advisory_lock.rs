//! The advisory-lock backend excludes, hands out increasing tokens, and is freed (and
//! reports the loss) when its connection is killed.

use std::time::Duration;

use fencelock::postgres::PgAdvisoryLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::Db;

async fn locker(db: &Db) -> PgAdvisoryLocker {
    let locks = PgAdvisoryLocker::connect(&db.server.connection_string(&db.name))
        .await
        .expect("connect");
    locks.ensure_schema().await.expect("schema");
    locks
}

#[tokio::test]
async fn advisory_locks_exclude_and_tokens_increase() {
    let db = Db::start().await;
    let a = locker(&db).await;
    let b = locker(&db).await;
    let options = LockOptions::new();

    let held = a.lock("report", &options).await.expect("lock");
    assert!(
        b.try_lock("report", &options)
            .await
            .expect("try_lock")
            .is_none()
    );
    let err = b
        .lock(
            "report",
            &options
                .clone()
                .with_wait_timeout(Duration::from_millis(200)),
        )
        .await
        .expect_err("times out");
    assert!(err.is_wait_timeout(), "{err}");

    let first = held.token();
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = b
        .try_lock("report", &options)
        .await
        .expect("try_lock")
        .expect("free");
    assert!(next.token() > first);
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn a_killed_connection_frees_the_lock_and_reports_the_loss() {
    let db = Db::start().await;
    let a = locker(&db).await;
    let b = locker(&db).await;
    let options = LockOptions::new();

    let held = a.lock("report", &options).await.expect("lock");
    let pid = held.backend_pid().expect("pid");
    let waiter = {
        let options = options.clone();
        tokio::spawn(async move { b.lock("report", &options).await })
    };
    let terminated: bool = db
        .client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated);

    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::Disconnected);
    assert!(!held.is_held());
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("waiter gets it")
        .expect("task")
        .expect("lock");
    assert!(next.token() > held.token());
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
}

/// A failure the server reports is shown in the server's words with its SQLSTATE, not as
/// tokio-postgres's bare "db error": here, locking before `ensure_schema` created the
/// token sequence.
#[tokio::test]
async fn a_server_error_says_what_the_server_said() {
    let db = Db::start().await;
    let locks = PgAdvisoryLocker::connect(&db.server.connection_string(&db.name))
        .await
        .expect("connect");
    let err = locks
        .lock("no-schema", &LockOptions::new())
        .await
        .expect_err("no token sequence yet");
    let shown = err.to_string();
    assert!(
        shown.contains("fencelock_advisory_tokens") && shown.contains("(42P01)"),
        "the error does not say what the server said: {shown}"
    );
}
