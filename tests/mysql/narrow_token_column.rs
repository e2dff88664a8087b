//! Outside strict SQL mode MariaDB stores a number too large for its column as the
//! column's largest value, with a warning only. A token column narrower than
//! `BIGINT UNSIGNED` then holds 4,294,967,295 for a token of 6,000,000,000, and every
//! later token above that passes the guard, stale or not. Before issue 35 the stale
//! write below committed; now a token that does not fit is refused, and `ensure_schema`
//! refuses a fence table whose token column is too narrow.

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError, TokenColumn};
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::support::{DECREMENT, Db};

const NEWER: u64 = 6_000_000_000;
const STALE: u64 = 5_500_000_000;

async fn fenced_write(fence: &Fence, conn: &mut Conn, token: u64) -> Result<(), FenceError> {
    let mut tx = fence.begin(conn, "SKU-1", FencingToken::new(token)).await?;
    tx.exec_drop(DECREMENT, (format!("holder-{token}"),))
        .await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_table_with_a_narrow_token_column_lets_no_stale_write_through() {
    let mut db = Db::start().await;
    db.inventory().await;
    db.conn
        .query_drop(
            "CREATE TABLE narrow_fences (resource VARBINARY(255) NOT NULL PRIMARY KEY, \
               token INT UNSIGNED NULL, writes BIGINT UNSIGNED NOT NULL DEFAULT 0, \
               updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
        )
        .await
        .expect("a table of the caller's");
    let fence = Fence::new().with_table("narrow_fences").expect("name");
    let mut conn = db.non_strict().await;

    let newer = fenced_write(&fence, &mut conn, NEWER).await;
    let stale = fenced_write(&fence, &mut conn, STALE).await;
    assert!(
        stale.is_err(),
        "the stale token {STALE} was accepted after {NEWER}"
    );
    let err = newer.expect_err("a token the column cannot hold is refused");
    assert!(
        matches!(&err, FenceError::TokenOutOfRange { token, .. } if token.get() == NEWER),
        "{err}"
    );
    assert_eq!(db.sku().await, (100, None), "nothing was written");

    let err = fence
        .ensure_schema(&mut db.conn)
        .await
        .expect_err("the existing table's column is too narrow");
    assert!(
        matches!(&err, FenceError::NarrowTokenColumn { column_type, .. } if column_type.contains("int")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrow_token_column_in_the_data_row_lets_no_stale_write_through() {
    let mut db = Db::start().await;
    db.narrow_inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let mut conn = db.non_strict().await;
    let mut write = async |token: u64| {
        inventory
            .update(
                &mut conn,
                "available = available - 1",
                "SKU-1",
                FencingToken::new(token),
                vec![],
            )
            .await
    };
    let newer = write(NEWER).await;
    let stale = write(STALE).await;
    assert!(
        stale.is_err(),
        "the stale token {STALE} was accepted after {NEWER}"
    );
    let err = newer.expect_err("a token the column cannot hold is refused");
    assert!(
        matches!(&err, FenceError::TokenOutOfRange { column, .. } if column.contains("int")),
        "{err}"
    );
    let left: Option<(i32, Option<u64>)> = db
        .conn
        .query_first("SELECT available, last_token FROM inventory WHERE sku = 'SKU-1'")
        .await
        .expect("read");
    assert_eq!(left, Some((100, None)), "nothing was written");
}

/// A signed BIGINT token column holds every token below 2^63: `ensure_schema` accepts
/// it (on 34d8cf9 it refused it as narrow), and a token above that is refused by the
/// write, outside strict SQL mode too, so no stale token passes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_bigint_token_column_is_accepted_and_a_token_beyond_it_refused() {
    let mut db = Db::start().await;
    db.inventory().await;
    db.conn
        .query_drop(
            "CREATE TABLE signed_fences (resource VARBINARY(255) NOT NULL PRIMARY KEY, \
               token BIGINT NULL, writes BIGINT UNSIGNED NOT NULL DEFAULT 0, \
               updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
        )
        .await
        .expect("a table of the caller's");
    let fence = Fence::new().with_table("signed_fences").expect("name");
    fence
        .ensure_schema(&mut db.conn)
        .await
        .expect("a signed BIGINT holds every token below 2^63");

    let mut conn = db.non_strict().await;
    fenced_write(&fence, &mut conn, NEWER)
        .await
        .expect("a token that fits");
    let beyond = 1u64 << 63;
    let err = fenced_write(&fence, &mut conn, beyond)
        .await
        .expect_err("2^63 does not fit");
    assert!(
        matches!(&err, FenceError::TokenOutOfRange { token, .. } if token.get() == beyond),
        "{err}"
    );
    let stale = fenced_write(&fence, &mut conn, STALE).await;
    assert!(stale.is_err(), "the stale token {STALE} was accepted");
    assert_eq!(
        db.sku().await,
        (99, Some(format!("holder-{NEWER}"))),
        "only the token that fits wrote"
    );
}
