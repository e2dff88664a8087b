//! The single-statement fence (`TokenColumn`): a stale token, an equal token and a
//! missing row are told apart, and a NULL token column takes the first token.

use fencelock::FencingToken;
use fencelock::mysql::{FenceError, TokenColumn};
use mysql_async::prelude::Queryable;

use crate::support::Db;

#[tokio::test]
async fn stale_equal_and_missing_are_refused_with_what_was_found() {
    let mut db = Db::start().await;
    db.inventory().await;
    let column = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let set = "available = available - 1, written_by = ?";

    // NULL: no token seen yet, any token writes.
    let updated = column
        .update(
            &mut db.conn,
            set,
            "SKU-1",
            FencingToken::new(5),
            vec!["t5".into()],
        )
        .await
        .expect("first token");
    assert_eq!(updated, 1);
    column
        .update(
            &mut db.conn,
            set,
            "SKU-1",
            FencingToken::new(9),
            vec!["t9".into()],
        )
        .await
        .expect("newer token");
    for (token, what) in [(8, "older"), (9, "equal")] {
        let err = column
            .update(
                &mut db.conn,
                set,
                "SKU-1",
                FencingToken::new(token),
                vec!["bad".into()],
            )
            .await
            .expect_err(what);
        assert!(
            matches!(&err, FenceError::Stale { resource, presented, current }
                if resource == "SKU-1" && *presented == FencingToken::new(token)
                    && *current == FencingToken::new(9)),
            "{what}: {err}"
        );
    }
    let err = column
        .update(
            &mut db.conn,
            set,
            "SKU-404",
            FencingToken::new(10),
            vec!["x".into()],
        )
        .await
        .expect_err("no such row");
    assert!(err.is_not_found(), "{err}");
    assert_eq!(db.sku().await, (98, Some("t9".into())));
    let stored: Option<u64> = db
        .conn
        .query_first("SELECT last_token FROM inventory WHERE sku = 'SKU-1'")
        .await
        .expect("read");
    assert_eq!(stored, Some(9));
}
