//! A write with token 41 after one with 42 is refused, with both numbers, and changes
//! nothing: under REPEATABLE READ and READ COMMITTED, through `begin` and through `check`
//! in the caller's own transaction, and on a connection with `CLIENT_FOUND_ROWS` (where
//! "rows affected" counts matched rows, not changed ones).

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError, FenceMode};
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, OptsBuilder, TxOpts};

use crate::support::{DECREMENT, Db, LEVELS};

async fn write(
    fence: &Fence,
    conn: &mut mysql_async::Conn,
    level: IsolationLevel,
    token: u64,
) -> Result<(), FenceError> {
    let mut options = TxOpts::default();
    options.with_isolation_level(level);
    let mut tx = fence
        .begin_with(conn, options, "SKU-1", FencingToken::new(token))
        .await?;
    tx.exec_drop(DECREMENT, (format!("holder-{token}"),))
        .await?;
    tx.commit().await
}

#[tokio::test]
async fn an_older_token_is_refused_and_applies_nothing_under_both_levels() {
    for level in LEVELS {
        let mut db = Db::start().await;
        db.inventory().await;
        let fence = Fence::new();
        fence.ensure_schema(&mut db.conn).await.expect("schema");

        write(&fence, &mut db.conn, level, 42)
            .await
            .expect("token 42 writes");
        let err = write(&fence, &mut db.conn, level, 41)
            .await
            .expect_err("token 41 is stale");
        match &err {
            FenceError::Stale {
                resource,
                presented,
                current,
            } => {
                assert_eq!(resource, "SKU-1");
                assert_eq!(*presented, FencingToken::new(41));
                assert_eq!(*current, FencingToken::new(42));
            }
            other => panic!("{level:?}: expected a stale-token error, got {other}"),
        }
        assert!(err.is_stale());
        assert_eq!(db.sku().await, (99, Some("holder-42".into())), "{level:?}");
        assert_eq!(
            fence.current(&mut db.conn, "SKU-1").await.expect("read"),
            Some(FencingToken::new(42))
        );
        // The same holder writes again; a newer one moves the fence.
        write(&fence, &mut db.conn, level, 42)
            .await
            .expect("equal token writes");
        write(&fence, &mut db.conn, level, 43)
            .await
            .expect("newer token writes");
        assert_eq!(db.sku().await, (97, Some("holder-43".into())), "{level:?}");
    }
}

#[tokio::test]
async fn check_refuses_inside_the_callers_transaction() {
    for level in LEVELS {
        let mut db = Db::start().await;
        db.inventory().await;
        let fence = Fence::new();
        fence.ensure_schema(&mut db.conn).await.expect("schema");
        write(&fence, &mut db.conn, level, 42)
            .await
            .expect("token 42 writes");

        let mut options = TxOpts::default();
        options.with_isolation_level(level);
        let mut tx = db.conn.start_transaction(options).await.expect("begin");
        let err = fence
            .check(&mut tx, "SKU-1", FencingToken::new(41))
            .await
            .expect_err("stale");
        assert!(err.is_stale(), "{err}");
        tx.rollback().await.expect("rollback");
        assert_eq!(db.sku().await, (99, Some("holder-42".into())), "{level:?}");
    }
}

#[tokio::test]
async fn strict_mode_refuses_an_equal_token() {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new().with_mode(FenceMode::Strict);
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    write(&fence, &mut db.conn, IsolationLevel::RepeatableRead, 7)
        .await
        .expect("first write of a new resource");
    let err = write(&fence, &mut db.conn, IsolationLevel::RepeatableRead, 7)
        .await
        .expect_err("equal token");
    assert!(
        matches!(err, FenceError::Stale { presented, current, .. }
            if presented == FencingToken::new(7) && current == FencingToken::new(7)),
        "{err}"
    );
    assert_eq!(db.sku().await, (99, Some("holder-7".into())));
}

#[tokio::test]
async fn client_found_rows_changes_nothing() {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    let opts = OptsBuilder::from_opts(db.server.opts(&db.name)).client_found_rows(true);
    let mut found_rows = mysql_async::Conn::new(opts).await.expect("connect");
    for level in LEVELS {
        write(&fence, &mut found_rows, level, 42)
            .await
            .expect("42 writes");
        // Equal token: the guarded UPDATE matches and changes the row, 1 either way.
        write(&fence, &mut found_rows, level, 42)
            .await
            .expect("42 again");
        let err = write(&fence, &mut found_rows, level, 41)
            .await
            .expect_err("41 is stale");
        assert!(err.is_stale(), "{err}");
    }
    assert_eq!(db.sku().await, (96, Some("holder-42".into())));
    found_rows.disconnect().await.expect("disconnect");
}
