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
