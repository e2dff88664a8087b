//! A fenced transaction can end before `commit`: an error aborts it (PostgreSQL then
//! answers `COMMIT` with `ROLLBACK`, which tokio-postgres reports as success), or a
//! `COMMIT` sent through it ends it and the statements after it autocommit, unfenced.
//! Before issue 35 `FencedTransaction::commit` reported success in both cases; now it
//! answers `TransactionEnded`.

use fencelock::FencingToken;
use fencelock::postgres::{Fence, FenceError};

use crate::support::{DECREMENT, Db};

async fn fenced_db() -> (Db, Fence) {
    let db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&db.client).await.expect("schema");
    (db, fence)
}

#[tokio::test]
async fn a_commit_of_an_aborted_transaction_is_an_error() {
    let (db, fence) = fenced_db().await;
    let mut client = db.connect().await;
    let tx = fence
        .begin(&mut client, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.execute(DECREMENT, &[&"fenced"]).await.expect("write");
    // A caller that goes on after an error: the transaction is aborted from here on.
    tx.execute("SELECT 1 / 0", &[]).await.expect_err("an error");
    let err = tx.commit().await.expect_err("nothing was committed");
    assert!(
        matches!(err, FenceError::TransactionEnded { aborted: true, .. }),
        "{err}"
    );
    assert_eq!(db.sku().await, (100, None), "nothing applied");
    assert_eq!(
        fence.current(&db.client, "SKU-1").await.expect("read"),
        None
    );
}

#[tokio::test]
async fn a_commit_after_a_commit_through_the_transaction_is_an_error() {
    let (db, fence) = fenced_db().await;
    let mut client = db.connect().await;
    let tx = fence
        .begin(&mut client, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.batch_execute("COMMIT").await.expect("commit through it");
    tx.execute(DECREMENT, &[&"unfenced"])
        .await
        .expect("autocommitted");
    let err = tx.commit().await.expect_err("not the fenced transaction");
    assert!(
        matches!(err, FenceError::TransactionEnded { aborted: false, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_new_transaction_begun_through_it_is_rolled_back_not_committed() {
    let (db, fence) = fenced_db().await;
    let mut client = db.connect().await;
    let tx = fence
        .begin(&mut client, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    tx.batch_execute("ROLLBACK; BEGIN")
        .await
        .expect("a new one");
    tx.execute(DECREMENT, &[&"unfenced"]).await.expect("write");
    let err = tx.commit().await.expect_err("not the fenced transaction");
    assert!(err.is_transaction_ended(), "{err}");
    assert_eq!(
        db.sku().await,
        (100, None),
        "the unfenced write was rolled back"
    );
    // The connection is fine afterwards, and so is a fenced write on it.
    let tx = fence
        .begin(&mut client, "SKU-1", FencingToken::new(11))
        .await
        .expect("passes");
    tx.execute(DECREMENT, &[&"fenced"]).await.expect("write");
    tx.commit().await.expect("commit");
    assert_eq!(db.sku().await, (99, Some("fenced".into())));
}
