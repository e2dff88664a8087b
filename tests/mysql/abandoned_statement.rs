//! A statement that is not the fence's, given up while it waits for a row lock (a
//! caller's `timeout` around its own `exec_drop`), leaves mysql_async owing its answer;
//! the connection's next command of any kind (here `DO 1`) reads that answer as its own,
//! mysql_async trusts the connection again, and every later answer is one behind. Before
//! issue 35c only a *fence* call's abandonment was remembered, so a stale retry on such
//! a connection passed the fence (its `UPDATE` read the upsert's "1 row") and committed.
//! Now every fence decision is taken on an answer that proves it answers the statement
//! just sent: whatever was abandoned on the connection, it is refused.

use std::time::Duration;

use fencelock::FencingToken;
use fencelock::mysql::{Claim, Fence, FenceError, IdempotencyKeys, TokenColumn, VersionColumn};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};

use crate::support::{DECREMENT, Db};

/// A writer's connection that has written once under `fence` (token 10), been refused
/// once and read the fence, so the fence's statements and `DECREMENT` are prepared on it
/// (a statement prepared on a lagging connection fails to parse the answer it reads).
async fn writer(db: &mut Db, found_rows: bool) -> (Fence, Conn) {
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    let opts = OptsBuilder::from_opts(db.server.opts(&db.name)).client_found_rows(found_rows);
    let mut writer = Conn::new(opts).await.expect("connect");
    let mut tx = fence
        .begin(&mut writer, "SKU-1", FencingToken::new(10))
        .await
        .expect("the first write passes");
    tx.exec_drop(DECREMENT, ("writer-10",))
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    let refused = fence
        .begin(&mut writer, "SKU-1", FencingToken::new(9))
        .await
        .expect_err("9 is older than 10");
    assert!(refused.is_stale(), "{refused}");
    let read = fence.current(&mut writer, "SKU-1").await.expect("read");
    assert_eq!(read, Some(FencingToken::new(10)));
    (fence, writer)
}

/// Holder 12 passes the fence and writes `SKU-1` (its data row stays locked); the
/// writer's own `DECREMENT` waits for that row and is given up after 300 ms; holder 12
/// commits (the abandoned `UPDATE` then runs, autocommitted); the writer's `DO 1` reads
/// the abandoned answer as its own.
async fn lag_by_one(db: &Db, fence: &Fence, writer: &mut Conn) {
    let mut holder = db.connect().await;
    let mut held = fence
        .begin(&mut holder, "SKU-1", FencingToken::new(12))
        .await
        .expect("holder 12 passes");
    held.exec_drop(DECREMENT, ("holder-12",))
        .await
        .expect("write");
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        writer.exec_drop(DECREMENT, ("abandoned",)),
    )
    .await;
    assert!(
        waited.is_err(),
        "the caller's UPDATE waits for the locked row"
    );
    held.commit().await.expect("holder 12 commits");
    drop(holder);
    writer.query_drop("DO 1").await.expect("a plain command");
    assert!(!writer.is_disconnected(), "mysql_async trusts it again");
}

/// begin, the protected write, commit: the whole fenced write.
async fn fenced_write(
    fence: &Fence,
    conn: &mut Conn,
    token: u64,
    by: &str,
) -> Result<(), FenceError> {
    let mut tx = fence.begin(conn, "SKU-1", FencingToken::new(token)).await?;
    tx.exec_drop(DECREMENT, (by,)).await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_write_after_an_abandoned_statement_of_the_callers_never_commits() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    lag_by_one(&db, &fence, &mut writer).await;

    for attempt in 1..=2 {
        let retried = fenced_write(&fence, &mut writer, 11, "stale-11");
        let outcome = tokio::time::timeout(Duration::from_secs(20), retried)
            .await
            .expect("the retry ends");
        assert_eq!(
            db.sku().await,
            (97, Some("abandoned".into())),
            "attempt {attempt}: only writer 10, holder 12 and the abandoned UPDATE wrote \
             ({outcome:?})"
        );
        let err = outcome.expect_err("a stale token never passes");
        assert!(err.is_connection_unusable(), "attempt {attempt}: {err}");
    }
    drop(writer);

    // A newer token on a fresh connection is not refused; the stale one is, as stale.
    let mut fresh = db.connect().await;
    fenced_write(&fence, &mut fresh, 13, "writer-13")
        .await
        .expect("13 is newer than 12");
    assert_eq!(db.sku().await, (96, Some("writer-13".into())));
    let err = fenced_write(&fence, &mut fresh, 11, "stale-11")
        .await
        .expect_err("stale");
    assert!(
        matches!(err, FenceError::Stale { presented, current, .. }
            if presented == FencingToken::new(11) && current == FencingToken::new(13)),
        "{err}"
    );
}

/// Without `CLIENT_FOUND_ROWS` the lagging `UPDATE` reads the upsert's "0 rows": a newer
/// token was refused as stale (with a made-up current token) instead of as a connection
/// that cannot be trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_token_after_an_abandoned_statement_is_never_called_stale() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, false).await;
    lag_by_one(&db, &fence, &mut writer).await;

    let retried = fenced_write(&fence, &mut writer, 13, "writer-13");
    let err = tokio::time::timeout(Duration::from_secs(20), retried)
        .await
        .expect("the retry ends")
        .expect_err("the connection is refused");
    assert!(
        err.is_connection_unusable() && !err.is_stale(),
        "a newer token was refused as stale: {err}"
    );
    drop(writer);

    let mut fresh = db.connect().await;
    fenced_write(&fence, &mut fresh, 13, "writer-13")
        .await
        .expect("13 is newer than 12");
    assert_eq!(db.sku().await, (96, Some("writer-13".into())));
}

/// A statement of the caller's on a fenced transaction, given up while it waits for a row
/// another transaction locked, then one more command: `commit` read answers one behind
/// (its `RELEASE SAVEPOINT` read the `DO 1`'s answer) and sent `COMMIT`, although its
/// docs promised `ConnectionUnusable` for an abandoned statement on the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_an_abandoned_statement_on_the_transaction_is_refused() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    let mut holder = db.connect().await;
    holder.query_drop("START TRANSACTION").await.expect("begin");
    holder
        .query_drop("SELECT available FROM inventory WHERE sku = 'SKU-1' FOR UPDATE")
        .await
        .expect("lock the data row");

    let mut tx = fence
        .begin(&mut writer, "SKU-1", FencingToken::new(11))
        .await
        .expect("11 is newer than 10");
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        tx.exec_drop(DECREMENT, ("abandoned-in-tx",)),
    )
    .await;
    assert!(waited.is_err(), "the UPDATE waits for the locked row");
    holder.query_drop("ROLLBACK").await.expect("unlock");
    tx.query_drop("DO 1").await.expect("a plain command");
    let committed = tokio::time::timeout(Duration::from_secs(20), tx.commit())
        .await
        .expect("the commit ends");
    drop(writer);
    let err = committed.expect_err("the commit is refused");
    assert!(err.is_connection_unusable(), "{err}");

    // Nothing of the transaction committed: a fresh fenced write sees token 10 and
    // writer 10's row (it waits, if need be, until the server has rolled back the closed
    // connection's transaction).
    let mut fresh = db.connect().await;
    let err = fenced_write(&fence, &mut fresh, 9, "stale-9")
        .await
        .expect_err("stale");
    assert!(
        matches!(err, FenceError::Stale { current, .. } if current == FencingToken::new(10)),
        "{err}"
    );
    assert_eq!(db.sku().await, (99, Some("writer-10".into())));
}

/// `Fence::current` on a connection one answer behind read the previous statement's
/// answer (no row: "no token") instead of the fence row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_on_a_lagging_connection_is_refused() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    lag_by_one(&db, &fence, &mut writer).await;
    let read = fence.current(&mut writer, "SKU-1").await;
    assert!(
        matches!(read, Err(FenceError::ConnectionUnusable)),
        "{read:?}"
    );
    let mut fresh = db.connect().await;
    assert_eq!(
        fence.current(&mut fresh, "SKU-1").await.expect("read"),
        Some(FencingToken::new(12))
    );
    assert_eq!(
        fence
            .current(&mut fresh, "no-such-resource")
            .await
            .expect("read"),
        None
    );
}

/// The server guarantee the fence's proof relies on: an `UPDATE` that evaluates
/// `LAST_INSERT_ID(expr)` on a row it matched reports expr as its OK packet's
/// last-insert-id, in the binary protocol (prepared statements, as the fence sends it),
/// with `CLIENT_FOUND_ROWS` on and off; one that matches nothing reports none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_reports_the_value_of_last_insert_id_expr_as_its_insert_id() {
    let mut db = Db::start().await;
    db.inventory().await;
    for found_rows in [true, false] {
        let opts = OptsBuilder::from_opts(db.server.opts(&db.name)).client_found_rows(found_rows);
        let mut conn = Conn::new(opts).await.expect("connect");
        let sql = "UPDATE inventory SET version = version + 1 + 0 * LAST_INSERT_ID(?) \
                   WHERE sku = ?";
        for nonce in [4_611_686_018_427_387_903_u64, 77] {
            conn.exec_drop(sql, (nonce, "SKU-1"))
                .await
                .expect("matches");
            assert_eq!(
                (conn.affected_rows(), conn.last_insert_id()),
                (1, Some(nonce)),
                "found_rows {found_rows}"
            );
            conn.exec_drop(sql, (nonce, "no-such-sku"))
                .await
                .expect("matches nothing");
            assert_eq!(
                (conn.affected_rows(), conn.last_insert_id()),
                (0, None),
                "found_rows {found_rows}"
            );
        }
    }
}

/// A connection refused because its answers lag is not handed out again by
/// mysql_async's pool: the next connection from a pool of one is a new one, and passes.
/// (Refused by `Fence::current`, outside a transaction: a connection returned with an
/// open transaction is cleaned up by the pool, and that cleanup happened to break on the
/// lagging answers; one without goes straight back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_not_handed_out_again_by_a_pool() {
    let mut db = Db::start().await;
    let (fence, writer) = writer(&mut db, true).await;
    writer.disconnect().await.expect("disconnect");
    let constraints = mysql_async::PoolConstraints::new(0, 1).expect("constraints");
    let pool_opts = mysql_async::PoolOpts::default()
        .with_constraints(constraints)
        .with_reset_connection(false);
    let opts = OptsBuilder::from_opts(db.server.opts(&db.name))
        .client_found_rows(true)
        .pool_opts(pool_opts);
    let pool = mysql_async::Pool::new(opts);

    let mut pooled = pool.get_conn().await.expect("a connection");
    let lagging = pooled.id();
    // Prepare the statements on it (the lag then shows in the fence's own answers).
    fenced_write(&fence, &mut pooled, 11, "pooled-11")
        .await
        .expect("11 is newer than 10");
    fence.current(&mut pooled, "SKU-1").await.expect("read");
    lag_by_one(&db, &fence, &mut pooled).await;
    let read = fence.current(&mut pooled, "SKU-1").await;
    assert!(
        matches!(read, Err(FenceError::ConnectionUnusable)),
        "{read:?}"
    );
    // The flag mysql_async's pool checks when a connection comes back: discard it.
    assert!(
        pooled.is_disconnected(),
        "the refused connection is not flagged"
    );
    drop(pooled);
    until_closed(&mut db, lagging).await;

    let mut next = pool.get_conn().await.expect("a connection");
    assert_ne!(
        next.id(),
        lagging,
        "the refused connection came back from the pool"
    );
    fenced_write(&fence, &mut next, 14, "writer-14")
        .await
        .expect("14 is newer than 12");
    drop(next);
    pool.disconnect().await.expect("pool closes");
}

/// Waits until the server no longer lists connection `id` (the pool closed it; one kept
/// in the pool stays listed, idle).
async fn until_closed(db: &mut Db, id: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let listed: Option<u64> = db
            .conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
                (id,),
            )
            .await
            .expect("PROCESSLIST");
        if listed == Some(0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "connection {id} still open 5 s after it was refused and returned to its pool"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `TokenColumn::update` on a connection one answer behind: its `UPDATE` read the
/// previous command's "0 rows", its read the `UPDATE`'s OK packet (no row), and a write
/// that was applied was reported as `NotFound`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_column_on_a_lagging_connection_is_refused() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    let column = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let set = "written_by = ?";
    column
        .update(
            &mut writer,
            set,
            "SKU-1",
            FencingToken::new(5),
            vec!["tc-5".into()],
        )
        .await
        .expect("5 is the first token");
    let refused = column
        .update(
            &mut writer,
            set,
            "SKU-1",
            FencingToken::new(4),
            vec!["tc-4".into()],
        )
        .await
        .expect_err("4 is older than 5");
    assert!(refused.is_stale(), "{refused}");
    lag_by_one(&db, &fence, &mut writer).await;

    let lagging = column
        .update(
            &mut writer,
            set,
            "SKU-1",
            FencingToken::new(6),
            vec!["tc-6".into()],
        )
        .await;
    assert!(
        matches!(lagging, Err(FenceError::ConnectionUnusable)),
        "{lagging:?}"
    );
}

/// `VersionColumn::compare_and_set` on a connection one answer behind: the same
/// misreading as `TokenColumn`'s, a swap that was applied reported as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_column_on_a_lagging_connection_is_refused() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    let column = VersionColumn::new("inventory", "sku", "version").expect("names");
    let set = "written_by = ?";
    column
        .compare_and_set(&mut writer, set, "SKU-1", 0, vec!["cas-0".into()])
        .await
        .expect("version 0");
    let conflict = column
        .compare_and_set(&mut writer, set, "SKU-1", 0, vec!["cas-0-again".into()])
        .await
        .expect_err("version is 1 now");
    assert!(
        matches!(
            conflict,
            FenceError::VersionConflict {
                current: Some(1),
                ..
            }
        ),
        "{conflict}"
    );
    lag_by_one(&db, &fence, &mut writer).await;

    let lagging = column
        .compare_and_set(&mut writer, set, "SKU-1", 1, vec!["cas-1".into()])
        .await;
    assert!(
        matches!(lagging, Err(FenceError::ConnectionUnusable)),
        "{lagging:?}"
    );
}

/// `IdempotencyKeys::claim` on a connection one answer behind: its `INSERT` read the
/// previous command's OK and a repeat was taken for the first claim (the work would run
/// twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_lagging_connection_is_refused() {
    let mut db = Db::start().await;
    let (fence, mut writer) = writer(&mut db, true).await;
    let keys = IdempotencyKeys::new();
    keys.ensure_schema(&mut db.conn).await.expect("schema");
    let first = keys.claim(&mut writer, "req-1").await.expect("claim");
    assert_eq!(first, Claim::First);
    let again = keys.claim(&mut writer, "req-1").await.expect("claim");
    assert_eq!(again, Claim::Duplicate);
    lag_by_one(&db, &fence, &mut writer).await;

    let lagging = keys.claim(&mut writer, "req-1").await;
    assert!(
        matches!(lagging, Err(FenceError::ConnectionUnusable)),
        "a repeat on a lagging connection: {lagging:?}"
    );
}

/// A claim given up while another transaction holds its key uncommitted: when that
/// transaction commits, the abandoned `INSERT`'s answer is a duplicate-key error. The next
/// claim (another key) reads that error as its own: taken for a repeat, its own key was
/// inserted and its work would never run. It must be refused instead.
#[tokio::test]
async fn a_claim_reading_an_abandoned_claims_duplicate_error_is_refused() {
    let mut db = Db::start().await;
    let keys = IdempotencyKeys::new();
    keys.ensure_schema(&mut db.conn).await.expect("schema");
    let mut writer = db.connect().await;
    // The claim's INSERT is prepared on the writer's connection.
    assert_eq!(
        keys.claim(&mut writer, "warm").await.expect("claim"),
        Claim::First
    );
    let mut other = db.connect().await;
    let mut held = other
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .expect("begin");
    assert_eq!(
        keys.claim(&mut held, "k1").await.expect("claim"),
        Claim::First
    );
    let waited =
        tokio::time::timeout(Duration::from_millis(300), keys.claim(&mut writer, "k1")).await;
    assert!(
        waited.is_err(),
        "the claim of k1 waits for the other transaction"
    );
    held.commit().await.expect("commit");

    let next = keys.claim(&mut writer, "k2").await;
    assert!(
        matches!(next, Err(FenceError::ConnectionUnusable)),
        "a claim of k2 reading k1's duplicate: {next:?}"
    );
}
