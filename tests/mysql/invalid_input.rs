//! Names that are not plain identifiers, and keys the helpers' tables cannot store
//! exactly, are refused before anything reaches the server.

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError, IdempotencyKeys, TokenColumn, VersionColumn};

use crate::support::Db;

const BAD: [&str; 8] = [
    "",
    "fences`; DROP TABLE t; --",
    "a.b.c",
    "1fences",
    "fen ces",
    "fences ",
    "fen-ces",
    "fencés",
];

#[test]
fn identifiers_are_refused() {
    for bad in BAD {
        let refused = |result: Result<(), FenceError>| {
            assert!(
                matches!(result, Err(FenceError::InvalidIdentifier(ref name)) if name == bad),
                "{bad:?}: {result:?}"
            );
        };
        refused(Fence::new().with_table(bad).map(drop));
        refused(IdempotencyKeys::with_table(bad).map(drop));
        refused(TokenColumn::new(bad, "sku", "last_token").map(drop));
        refused(TokenColumn::new("inventory", bad, "last_token").map(drop));
        refused(VersionColumn::new("inventory", "sku", bad).map(drop));
    }
    assert!(Fence::new().with_table("app.fences").is_ok());
    assert!(Fence::new().with_table(&"f".repeat(65)).is_err());
}

#[tokio::test]
async fn keys_that_cannot_be_stored_exactly_are_refused() {
    let mut db = Db::start().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    let keys = IdempotencyKeys::new();
    keys.ensure_schema(&mut db.conn).await.expect("schema");
    let long = "r".repeat(256);
    for bad in ["", long.as_str()] {
        let err = fence
            .begin(&mut db.conn, bad, FencingToken::new(1))
            .await
            .expect_err("refused");
        assert!(matches!(err, FenceError::InvalidKey { .. }), "{err}");
        let err = keys.claim(&mut db.conn, bad).await.expect_err("refused");
        assert!(matches!(err, FenceError::InvalidKey { .. }), "{err}");
    }
    // 255 bytes is the limit, and fits.
    let tx = fence
        .begin(&mut db.conn, &"r".repeat(255), FencingToken::new(1))
        .await
        .expect("255 bytes");
    tx.commit().await.expect("commit");
}

/// A consistent snapshot would be taken before the fence row's lock is waited for: the
/// transaction would read data older than the previous holder's commit and could
/// overwrite it with tokens in order (a lost update). Refused before anything is sent.
#[tokio::test]
async fn a_consistent_snapshot_is_refused() {
    let mut db = Db::start().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    let mut options = mysql_async::TxOpts::default();
    options.with_consistent_snapshot(true);
    let err = fence
        .begin_with(&mut db.conn, options, "snapshot", FencingToken::new(1))
        .await
        .expect_err("refused");
    assert!(matches!(err, FenceError::UnsupportedOptions(_)), "{err}");
    // Nothing was started: the connection takes a fenced transaction at once.
    let tx = fence
        .begin(&mut db.conn, "snapshot", FencingToken::new(1))
        .await
        .expect("begin");
    tx.commit().await.expect("commit");
}
