//! The article's single-statement form: `... WHERE last_token < $token`, 0 rows rejected.

use fencelock::FencingToken;
use fencelock::postgres::{FenceError, TokenColumn};

use crate::support::Db;

#[tokio::test]
async fn the_token_in_the_row_refuses_older_writers() {
    let db = Db::start().await;
    db.inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let set = "available = available - 1, written_by = $3";

    let updated = inventory
        .update(
            &db.client,
            set,
            &"SKU-1",
            FencingToken::new(42),
            &[&"holder-42"],
        )
        .await
        .expect("newer token writes");
    assert_eq!(updated, 1);

    let err = inventory
        .update(
            &db.client,
            set,
            &"SKU-1",
            FencingToken::new(41),
            &[&"holder-41"],
        )
        .await
        .expect_err("older token refused");
    assert!(
        matches!(err, FenceError::Stale { current, .. } if current == FencingToken::new(42)),
        "{err}"
    );
    assert_eq!(db.sku().await, (99, Some("holder-42".into())));

    let err = inventory
        .update(&db.client, set, &"SKU-404", FencingToken::new(50), &[&"x"])
        .await
        .expect_err("no such row");
    assert!(matches!(err, FenceError::NotFound { .. }), "{err}");
}

/// A row whose token column is NULL (added to an existing table without a default, or
/// inserted without one) has seen no token yet: the first fenced write succeeds and sets
/// it, and an older one after it is refused.
#[tokio::test]
async fn a_null_token_column_takes_the_first_write() {
    let db = Db::start().await;
    db.client
        .batch_execute(
            "CREATE TABLE jobs (id text PRIMARY KEY, state text NOT NULL, last_token bigint); \
             INSERT INTO jobs (id, state) VALUES ('job-1', 'new');",
        )
        .await
        .expect("create jobs");
    let jobs = TokenColumn::new("jobs", "id", "last_token").expect("names");

    let updated = jobs
        .update(
            &db.client,
            "state = $3",
            &"job-1",
            FencingToken::new(7),
            &[&"run-7"],
        )
        .await
        .expect("the first fenced write on a NULL token succeeds");
    assert_eq!(updated, 1);

    let err = jobs
        .update(
            &db.client,
            "state = $3",
            &"job-1",
            FencingToken::new(6),
            &[&"run-6"],
        )
        .await
        .expect_err("an older token after it is refused");
    assert!(
        matches!(err, FenceError::Stale { current, presented, .. }
            if current == FencingToken::new(7) && presented == FencingToken::new(6)),
        "{err}"
    );
    let row = db
        .client
        .query_one("SELECT state, last_token FROM jobs WHERE id = 'job-1'", &[])
        .await
        .expect("read");
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, Option<i64>>(1)),
        ("run-7".to_owned(), Some(7))
    );
}
