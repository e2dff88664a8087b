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

/// Writers with interleaved tokens, each updating through `TokenColumn` and then logging
/// its token in the same transaction: the accepted updates took effect in increasing
/// token order, under REPEATABLE READ and READ COMMITTED (where InnoDB's semi-consistent
/// read first looks at the last committed version of a locked row, and must re-check the
/// guard once it holds the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_tokens_take_effect_in_increasing_order() {
    use std::time::Duration;

    use mysql_async::TxOpts;

    for level in crate::support::LEVELS {
        let mut db = Db::start().await;
        db.inventory().await;
        db.conn
            .query_drop(
                "CREATE TABLE applied (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
            )
            .await
            .expect("create applied");
        let tokens: Vec<u64> = (0..24u64).map(|i| (i * 7) % 24 + 1).collect();
        let mut tasks = Vec::new();
        for token in tokens {
            let mut conn = db.connect_at(level).await;
            tasks.push(tokio::spawn(async move {
                let column = TokenColumn::new("inventory", "sku", "last_token").expect("names");
                let mut tx = conn
                    .start_transaction(TxOpts::default())
                    .await
                    .expect("begin");
                match column
                    .update(
                        &mut tx,
                        "written_by = ?",
                        "SKU-1",
                        FencingToken::new(token),
                        vec![format!("t{token}").into()],
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(err) if err.is_stale() => return false,
                    Err(err) => panic!("token {token}: unexpected {err}"),
                }
                tx.exec_drop("INSERT INTO applied (token) VALUES (?)", (token,))
                    .await
                    .expect("log");
                // Hold the row a moment, so that others queue behind it.
                tokio::time::sleep(Duration::from_millis(5)).await;
                tx.commit().await.expect("commit");
                true
            }));
        }
        let mut accepted = 0;
        for task in tasks {
            if task.await.expect("task") {
                accepted += 1;
            }
        }
        let applied: Vec<u64> = db
            .conn
            .query("SELECT token FROM applied ORDER BY id")
            .await
            .expect("read");
        assert_eq!(applied.len(), accepted, "{level:?}");
        assert!(
            applied.windows(2).all(|pair| pair[0] < pair[1]),
            "{level:?}: accepted updates went backwards: {applied:?}"
        );
        assert_eq!(applied.last(), Some(&24), "{level:?}");
        assert_eq!(db.sku().await.1.as_deref(), Some("t24"), "{level:?}");
    }
}
