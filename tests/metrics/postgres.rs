//! PostgreSQL advisory locks: grants, releases, and the loss of a lock whose connection
//! was terminated.

use std::time::Duration;

use fencelock::metrics::names;
use fencelock::postgres::PgAdvisoryLocker;
use fencelock::testkit::PostgresServer;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::recorded::recorded;

const POSTGRES: (&str, &str) = ("backend", "postgres");

#[tokio::test]
async fn postgres_operations_are_counted() {
    let metrics = recorded();
    let server = PostgresServer::start().await.expect("postgres");
    let database = server.create_database().await.expect("database");
    let admin = server.connect(&database).await.expect("admin connection");
    let locks = PgAdvisoryLocker::connect(&server.connection_string(&database))
        .await
        .expect("connect");
    locks.ensure_schema().await.expect("schema");
    let options = LockOptions::new();

    let held = locks.lock("m-pg", &options).await.expect("lock");
    assert_eq!(
        metrics.counter(names::GRANTS, &[POSTGRES, ("lock", "m-pg")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[POSTGRES]), 1.0);
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[POSTGRES, ("outcome", "released")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[POSTGRES]), 0.0);

    let held = locks.lock("m-pg-lost", &options).await.expect("lock");
    let pid = held.backend_pid().expect("pid");
    let _ = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::Disconnected);
    assert_eq!(
        metrics.counter(names::LOSSES, &[POSTGRES, ("reason", "disconnected")]),
        1
    );
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[POSTGRES]), 0.0);
}
