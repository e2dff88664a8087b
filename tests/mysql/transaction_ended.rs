//! The server can end a fenced transaction without the client noticing: a deadlock rolls
//! it back, a statement such as `CREATE TABLE` commits it implicitly. Whatever runs after
//! that runs unfenced, outside it. Before issue 35 `FencedTransaction::commit` then
//! reported success (its `COMMIT` ended nothing, or committed a new, unfenced
//! transaction); now it answers `TransactionEnded` and commits nothing.

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError};
use mysql_async::prelude::Queryable;

use crate::support::{DECREMENT, Db, until_a_writer_waits_for_the_lock};

async fn fenced_db() -> (Db, Fence) {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    (db, fence)
}

fn assert_ended(result: Result<(), FenceError>) {
    let err = result.expect_err("commit must not report success");
    assert!(err.is_transaction_ended(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_an_implicit_commit_by_ddl_is_an_error() {
    let (mut db, fence) = fenced_db().await;
    let mut conn = db.connect().await;
    let mut tx = fence
        .begin(&mut conn, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.exec_drop(DECREMENT, ("fenced",)).await.expect("write");
    // Commits the transaction so far; the next statement autocommits, unfenced.
    tx.query_drop("CREATE TABLE audit (id INT) ENGINE=InnoDB")
        .await
        .expect("ddl");
    tx.exec_drop(DECREMENT, ("unfenced",)).await.expect("write");
    assert_ended(tx.commit().await);
    drop(conn);
    // Both writes stand (the DDL committed the first, the second committed itself): the
    // error is the only thing the caller can still be told.
    assert_eq!(db.sku().await, (98, Some("unfenced".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_autocommit_off_the_new_transaction_after_ddl_is_rolled_back() {
    let (mut db, fence) = fenced_db().await;
    let mut conn = db.connect().await;
    conn.query_drop("SET autocommit = 0")
        .await
        .expect("autocommit off");
    let mut tx = fence
        .begin(&mut conn, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.exec_drop(DECREMENT, ("fenced",)).await.expect("write");
    tx.query_drop("CREATE TABLE audit (id INT) ENGINE=InnoDB")
        .await
        .expect("ddl");
    // A new transaction starts implicitly: the old COMMIT would have committed it.
    tx.exec_drop(DECREMENT, ("unfenced",)).await.expect("write");
    assert_ended(tx.commit().await);
    drop(conn);
    assert_eq!(db.sku().await, (99, Some("fenced".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_a_deadlock_rolled_the_transaction_back_is_an_error() {
    let (mut db, fence) = fenced_db().await;
    db.conn
        .query_drop(
            "INSERT INTO inventory (sku, available) VALUES ('SKU-2', 100), ('SKU-3', 100); \
             CREATE TABLE weight (id INT PRIMARY KEY) ENGINE=InnoDB",
        )
        .await
        .expect("more rows");
    let mut conn = db.connect().await;
    let mut tx = fence
        .begin(&mut conn, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.exec_drop(DECREMENT, ("fenced",)).await.expect("write");

    // The other transaction is heavier (InnoDB rolls back the one with fewer changed rows
    // and locks), holds SKU-2 and waits for SKU-1.
    let mut other = db.connect().await;
    let heavy = tokio::spawn(async move {
        let mut tx = other
            .start_transaction(Default::default())
            .await
            .expect("begin");
        tx.query_drop(
            "INSERT INTO weight (id) WITH RECURSIVE n (i) AS \
             (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) SELECT i FROM n",
        )
        .await
        .expect("weight");
        tx.query_drop("UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-2'")
            .await
            .expect("lock SKU-2");
        tx.query_drop("UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-1'")
            .await
            .expect("waits for SKU-1, then gets it");
        tx.commit().await.expect("commit");
    });
    until_a_writer_waits_for_the_lock(&mut db).await;
    let deadlock = tx
        .exec_drop(
            "UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-2'",
            (),
        )
        .await
        .expect_err("a deadlock, and the fenced transaction is the victim");
    assert!(
        matches!(&deadlock, mysql_async::Error::Server(s) if s.code == 1213),
        "{deadlock}"
    );
    // A caller that goes on after the error: this runs unfenced, autocommitted.
    tx.exec_drop(
        "UPDATE inventory SET available = available - 1, written_by = 'unfenced' \
         WHERE sku = 'SKU-3'",
        (),
    )
    .await
    .expect("write");
    assert_ended(tx.commit().await);
    heavy.await.expect("the other transaction commits");
}
