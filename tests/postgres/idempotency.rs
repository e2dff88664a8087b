//! Idempotency keys: the first request proceeds, a duplicate is recognised, and a rolled
//! back attempt frees the key.

use fencelock::postgres::{Claim, IdempotencyKeys};

use crate::support::Db;

#[tokio::test]
async fn the_first_request_wins_and_duplicates_are_detected() {
    let mut db = Db::start().await;
    let keys = IdempotencyKeys::new();
    keys.ensure_schema(&db.client).await.expect("schema");

    assert_eq!(
        keys.claim(&db.client, "REQ-8891").await.expect("claim"),
        Claim::First
    );
    assert_eq!(
        keys.claim(&db.client, "REQ-8891").await.expect("claim"),
        Claim::Duplicate
    );

    // Claimed inside a transaction that rolls back: the key is free again.
    let tx = db.client.transaction().await.expect("begin");
    assert_eq!(
        keys.claim(&tx, "REQ-9000").await.expect("claim"),
        Claim::First
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        keys.claim(&db.client, "REQ-9000").await.expect("claim"),
        Claim::First
    );
}
