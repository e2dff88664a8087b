//! The backend contract (`fencelock::testkit::conformance`) on PostgreSQL advisory locks:
//! three clients, the holder's connection terminated. Advisory locks have no TTL (they
//! live as long as their connection): the expiry check does not apply.

use fencelock::postgres::{PgAdvisoryGuard, PgAdvisoryLocker};
use fencelock::testkit::conformance::Contract;

use crate::support::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory_locks_keep_the_backend_contract() {
    let db = Db::start().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let locks = PgAdvisoryLocker::connect(&db.server.connection_string(&db.name))
            .await
            .expect("connect");
        locks.ensure_schema().await.expect("schema");
        clients.push(locks);
    }
    let admin = std::sync::Arc::new(db.server.connect(&db.name).await.expect("admin"));
    Contract::new(clients)
        .with_expiry(false)
        .with_take_away(move |guard: &PgAdvisoryGuard| {
            let (admin, pid) = (admin.clone(), guard.backend_pid().expect("pid"));
            Box::pin(async move {
                admin
                    .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                    .await
                    .expect("terminate");
            })
        })
        .run_all()
        .await;
}
