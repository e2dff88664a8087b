//! One `TokenColumn` (a table named without its database) used on connections to two
//! databases whose token columns differ: a `BIGINT UNSIGNED` in one, an `INT UNSIGNED` in
//! the other.
//! The column's capacity was read once, in the first database, and trusted everywhere
//! after: in the second, outside strict SQL mode, a token of 6,000,000,000 was stored as
//! 4,294,967,295 and the update reported success, and from then on every token above
//! that passed the guard, stale or not. Now each update asks its connection where it is
//! (server and database), reads the column there the first time, sends statements
//! prepared for that database, and refuses a token the column cannot hold.

use fencelock::FencingToken;
use fencelock::mysql::{FenceError, TokenColumn};
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::support::Db;

const NEWER: u64 = 6_000_000_000;
const STALE: u64 = 5_500_000_000;

async fn update(column: &TokenColumn, conn: &mut Conn, token: u64) -> Result<u64, FenceError> {
    column
        .update(
            conn,
            "available = available - 1",
            "SKU-1",
            FencingToken::new(token),
            vec![],
        )
        .await
}

async fn row(conn: &mut Conn, database: &str) -> Option<(i32, Option<u64>)> {
    conn.query_first(format!(
        "SELECT available, last_token FROM `{database}`.inventory WHERE sku = 'SKU-1'"
    ))
    .await
    .expect("read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_column_read_in_one_database_is_read_again_in_another() {
    let mut wide = Db::start().await;
    wide.inventory().await;
    let mut narrow = Db::start().await;
    narrow.narrow_inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");

    // A connection to each (one pool per tenant, say), both outside strict SQL mode.
    let mut wide_conn = wide.non_strict().await;
    let mut narrow_conn = narrow.non_strict().await;
    assert_eq!(
        update(&inventory, &mut wide_conn, 5).await.expect("wide"),
        1
    );

    let newer = update(&inventory, &mut narrow_conn, NEWER).await;
    let stale = update(&inventory, &mut narrow_conn, STALE).await;
    let left = row(&mut narrow_conn, &narrow.name).await;
    assert_eq!(left, Some((100, None)), "written in the narrow database");
    let err = newer.expect_err("a token the narrow column cannot hold is refused");
    assert!(
        matches!(&err, FenceError::TokenOutOfRange { column, .. } if column.contains("int")),
        "{err}"
    );
    assert!(stale.is_err(), "the stale token {STALE} was accepted");

    // Small tokens still go through there, and the wide database still takes large
    // ones (its column read again).
    assert_eq!(
        update(&inventory, &mut narrow_conn, 7)
            .await
            .expect("narrow"),
        1
    );
    assert_eq!(
        row(&mut narrow_conn, &narrow.name).await,
        Some((99, Some(7)))
    );
    assert_eq!(
        update(&inventory, &mut wide_conn, NEWER)
            .await
            .expect("wide"),
        1
    );
    assert_eq!(
        row(&mut wide_conn, &wide.name).await,
        Some((98, Some(NEWER)))
    );
    let err = update(&inventory, &mut wide_conn, STALE)
        .await
        .expect_err("stale in the wide database");
    assert!(
        matches!(&err, FenceError::Stale { current, .. } if current.get() == NEWER),
        "{err}"
    );
}

/// Clones of one `TokenColumn` alternating between the two databases: each update uses
/// the capacity of its own connection's database (kept per place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_alternating_between_databases_each_use_their_own_column() {
    let (mut wide, mut narrow) = (Db::start().await, Db::start().await);
    wide.inventory().await;
    narrow.narrow_inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let mut wide_conn = wide.non_strict().await;
    let mut narrow_conn = narrow.non_strict().await;
    for round in 0..3u64 {
        let (a, b) = (inventory.clone(), inventory.clone());
        let token = NEWER + round;
        assert_eq!(update(&a, &mut wide_conn, token).await.expect("wide"), 1);
        let err = update(&b, &mut narrow_conn, token)
            .await
            .expect_err("too large for the narrow column");
        assert!(matches!(err, FenceError::TokenOutOfRange { .. }), "{err}");
        assert_eq!(
            update(&b, &mut narrow_conn, round + 1)
                .await
                .expect("narrow"),
            1
        );
    }
    assert_eq!(
        row(&mut narrow_conn, &narrow.name).await,
        Some((97, Some(3)))
    );
    assert_eq!(
        row(&mut wide_conn, &wide.name).await,
        Some((97, Some(NEWER + 2)))
    );
}

/// A `USE` on a connection whose statements mysql_async prepared before it (they keep the
/// database they were prepared in): whatever the update answers, no token lands in a
/// column whose capacity was not checked: the narrow row is not cut to 4,294,967,295.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_after_the_statements_were_prepared_writes_no_unchecked_column() {
    let (mut wide, mut narrow) = (Db::start().await, Db::start().await);
    wide.inventory().await;
    narrow.narrow_inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let mut conn = narrow.non_strict().await;
    assert_eq!(update(&inventory, &mut conn, 7).await.expect("narrow"), 1);
    conn.query_drop(format!("USE `{}`", wide.name))
        .await
        .expect("USE");
    let answer = update(&inventory, &mut conn, NEWER).await;
    let mut check = narrow.connect().await;
    assert_eq!(
        row(&mut check, &narrow.name).await,
        Some((99, Some(7))),
        "the narrow row after {answer:?}"
    );
    let wide_row = row(&mut check, &wide.name).await;
    assert!(
        matches!(wide_row, Some((100, None)) | Some((99, Some(NEWER)))),
        "the wide row after {answer:?}: {wide_row:?}"
    );
}

/// The same, the connection first in a database without the table (so the column was
/// never found): the update after the `USE` writes nothing unchecked either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_after_a_database_without_the_table_writes_no_unchecked_column() {
    let (empty, mut narrow) = (Db::start().await, Db::start().await);
    narrow.narrow_inventory().await;
    let inventory = TokenColumn::new("inventory", "sku", "last_token").expect("names");
    let mut conn = empty.non_strict().await;
    let missing = update(&inventory, &mut conn, 5).await;
    assert!(
        matches!(missing, Err(FenceError::UnknownTokenColumn { .. })),
        "no table there: {missing:?}"
    );
    // A TEMPORARY table is not in information_schema: refused, nothing written.
    conn.query_drop(
        "CREATE TEMPORARY TABLE inventory (sku VARCHAR(64) PRIMARY KEY, \
           available INT NOT NULL, last_token INT UNSIGNED NULL); \
         INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100)",
    )
    .await
    .expect("a temporary inventory");
    let temporary = update(&inventory, &mut conn, NEWER).await;
    assert!(
        matches!(temporary, Err(FenceError::UnknownTokenColumn { .. })),
        "a temporary table: {temporary:?}"
    );
    let left: Option<(i32, Option<u64>)> = conn
        .query_first("SELECT available, last_token FROM inventory")
        .await
        .expect("read");
    assert_eq!(left, Some((100, None)), "the temporary row");
    conn.query_drop("DROP TEMPORARY TABLE inventory")
        .await
        .expect("drop");
    conn.query_drop(format!("USE `{}`", narrow.name))
        .await
        .expect("USE");
    let answer = update(&inventory, &mut conn, NEWER).await;
    let mut check = narrow.connect().await;
    assert_eq!(
        row(&mut check, &narrow.name).await,
        Some((100, None)),
        "the narrow row after {answer:?}"
    );
}
