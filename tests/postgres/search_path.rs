//! Roles (or connections) with different `search_path`s share the token sequence and the
//! fence table: their names are schema-qualified (`public.` by default). Before issue 35
//! each `search_path` found a sequence and a fence table of its own: two clients drew the
//! same tokens, and each fence table accepted the other's stale writes.

use fencelock::postgres::{Fence, PgAdvisoryLocker};
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use tokio_postgres::NoTls;

use crate::support::Db;

/// A database with schemas `sa` and `sb`, and connection strings whose `search_path` is
/// each of them.
async fn two_search_paths() -> (Db, [String; 2]) {
    let db = Db::start().await;
    db.client
        .batch_execute("CREATE SCHEMA sa; CREATE SCHEMA sb")
        .await
        .expect("schemas");
    let base = db.server.connection_string(&db.name);
    let paths = ["sa", "sb"].map(|schema| format!("{base} options='-c search_path={schema}'"));
    (db, paths)
}

#[tokio::test]
async fn clients_with_different_search_paths_draw_from_one_sequence() {
    let (_db, paths) = two_search_paths().await;
    let mut tokens = Vec::new();
    for path in &paths {
        let locks = PgAdvisoryLocker::connect(path).await.expect("connect");
        locks.ensure_schema().await.expect("schema");
        let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
        tokens.push(guard.token());
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    assert!(tokens[1] > tokens[0], "tokens repeat: {tokens:?}");
}

#[tokio::test]
async fn writers_with_different_search_paths_meet_at_one_fence() {
    let (_db, paths) = two_search_paths().await;
    let mut clients = Vec::new();
    for path in &paths {
        let (client, connection) = tokio_postgres::connect(path, NoTls).await.expect("connect");
        tokio::spawn(connection);
        clients.push(client);
    }
    let fence = Fence::new();
    for client in &clients {
        fence.ensure_schema(client).await.expect("schema");
    }
    let newer = fence
        .begin(&mut clients[0], "SKU-1", FencingToken::new(10))
        .await
        .expect("10 passes");
    newer.commit().await.expect("commit");
    let err = fence
        .begin(&mut clients[1], "SKU-1", FencingToken::new(5))
        .await
        .expect_err("5 is stale, whatever the search_path");
    assert!(err.is_stale(), "{err}");
}

#[tokio::test]
async fn the_sequence_can_live_in_a_schema_of_ones_own() {
    let (db, paths) = two_search_paths().await;
    let locks = PgAdvisoryLocker::connect(&paths[0])
        .await
        .expect("connect")
        .with_sequence("sb.job_tokens")
        .expect("a qualified name");
    locks.ensure_schema().await.expect("schema");
    let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
    let drawn: i64 = db
        .client
        .query_one("SELECT last_value FROM sb.job_tokens", &[])
        .await
        .expect("the sequence is in sb")
        .get(0);
    assert_eq!(
        guard.token(),
        FencingToken::new(u64::try_from(drawn).expect("token"))
    );
    let err = locks
        .with_sequence("sb.job_tokens; DROP TABLE x")
        .expect_err("not an identifier");
    assert!(err.is_invalid_input(), "{err}");
}
