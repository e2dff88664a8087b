//! Idempotency keys: the first claim proceeds, a repeat is recognised, a rolled-back claim
//! frees the key, and keys differing only in case or trailing spaces stay apart.

use fencelock::mysql::{Claim, IdempotencyKeys};
use mysql_async::TxOpts;

use crate::support::Db;

#[tokio::test]
async fn first_then_duplicate_and_a_rollback_frees_the_key() {
    let mut db = Db::start().await;
    let keys = IdempotencyKeys::new();
    keys.ensure_schema(&mut db.conn).await.expect("schema");

    assert_eq!(
        keys.claim(&mut db.conn, "req-1").await.expect("claim"),
        Claim::First
    );
    assert_eq!(
        keys.claim(&mut db.conn, "req-1").await.expect("again"),
        Claim::Duplicate
    );
    for other in ["REQ-1", "req-1 "] {
        assert_eq!(
            keys.claim(&mut db.conn, other).await.expect("claim"),
            Claim::First,
            "{other:?} is another key"
        );
    }

    let mut tx = db
        .conn
        .start_transaction(TxOpts::default())
        .await
        .expect("begin");
    assert_eq!(
        keys.claim(&mut tx, "req-2").await.expect("claim"),
        Claim::First
    );
    // A duplicate inside a transaction does not break it.
    assert_eq!(
        keys.claim(&mut tx, "req-1").await.expect("dup"),
        Claim::Duplicate
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        keys.claim(&mut db.conn, "req-2").await.expect("claim"),
        Claim::First,
        "the rolled-back claim freed the key"
    );
}

/// A keys table with a surrogate AUTO_INCREMENT id: the server reports the id it
/// generated, not the claim's own proof, and the claim must still be taken as the first.
#[tokio::test]
async fn a_table_with_an_auto_increment_id_claims_first_then_duplicate() {
    use mysql_async::prelude::Queryable;
    let mut db = Db::start().await;
    db.conn
        .query_drop(
            "CREATE TABLE claims_ai (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             `key` VARBINARY(255) NOT NULL UNIQUE) ENGINE=InnoDB",
        )
        .await
        .expect("table");
    let keys = IdempotencyKeys::with_table("claims_ai").expect("table name");
    assert_eq!(
        keys.claim(&mut db.conn, "req-1").await.expect("claim"),
        Claim::First
    );
    assert_eq!(
        keys.claim(&mut db.conn, "req-1").await.expect("again"),
        Claim::Duplicate
    );
}
