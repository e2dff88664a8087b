//! A `Fence::begin` given up while its statement waits for the fence row (a caller's
//! timeout) leaves mysql_async owing that statement's answer: the connection's next
//! command would read it, and every later answer would be one behind. Before issue 35 a
//! retry on that connection then passed the fence with a stale token (on a
//! `CLIENT_FOUND_ROWS` connection the fence's `UPDATE` read the upsert's "1 row") and
//! committed its write, or refused a newer token as stale. Now the fence refuses such a
//! connection with a typed error, and a fresh connection does the right thing.

use std::time::Duration;

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};

use crate::support::{DECREMENT, Db};

/// A writer's connection that has written once under `fence` and been refused once (so
/// all three of the fence's statements are prepared on it, as on any connection in use
/// for a while), and a holder with a newer token
/// whose open transaction keeps the fence row locked: `writer`'s next `begin` waits.
async fn setup(db: &mut Db, found_rows: bool) -> (Fence, Conn) {
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");
    let opts = OptsBuilder::from_opts(db.server.opts(&db.name)).client_found_rows(found_rows);
    let mut writer = Conn::new(opts).await.expect("connect");
    let mut tx = fence
        .begin(&mut writer, "SKU-1", FencingToken::new(10))
        .await
        .expect("the first write passes");
    tx.exec_drop(DECREMENT, ("writer-10",))
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    let refused = fence
        .begin(&mut writer, "SKU-1", FencingToken::new(9))
        .await
        .expect_err("9 is older than 10");
    assert!(refused.is_stale(), "{refused}");
    (fence, writer)
}

/// Holder 12 passes the fence and keeps its transaction open; `writer` begins with
/// `token` and gives up after 300 ms, while its upsert waits for the row; then holder 12
/// commits.
async fn abandon_a_begin(db: &Db, fence: &Fence, writer: &mut Conn, token: u64) {
    let mut holder = db.connect().await;
    let mut held = fence
        .begin(&mut holder, "SKU-1", FencingToken::new(12))
        .await
        .expect("holder 12 passes");
    held.exec_drop(DECREMENT, ("holder-12",))
        .await
        .expect("write");
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        fence.begin(writer, "SKU-1", FencingToken::new(token)),
    )
    .await;
    assert!(waited.is_err(), "the begin waits for the locked fence row");
    held.commit().await.expect("holder 12 commits");
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_retry_on_a_connection_owing_an_answer_never_commits() {
    let mut db = Db::start().await;
    let (fence, mut writer) = setup(&mut db, true).await;
    abandon_a_begin(&db, &fence, &mut writer, 11).await;

    // The retry, same connection, same stale token.
    let retried = async {
        let mut tx = fence
            .begin(&mut writer, "SKU-1", FencingToken::new(11))
            .await?;
        tx.exec_drop(DECREMENT, ("stale-11",)).await?;
        tx.commit().await
    };
    let err = tokio::time::timeout(Duration::from_secs(20), retried)
        .await
        .expect("the retry ends")
        .expect_err("a stale token never passes");
    assert!(err.is_connection_unusable(), "{err}");
    drop(writer);
    assert_eq!(
        db.sku().await,
        (98, Some("holder-12".into())),
        "only writer 10 and holder 12 wrote"
    );

    // A fresh connection gets the right answer.
    let mut fresh = db.connect().await;
    let err = fence
        .begin(&mut fresh, "SKU-1", FencingToken::new(11))
        .await
        .expect_err("stale");
    assert!(
        matches!(err, FenceError::Stale { presented, current, .. }
            if presented == FencingToken::new(11) && current == FencingToken::new(12)),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_token_on_a_connection_owing_an_answer_is_never_called_stale() {
    let mut db = Db::start().await;
    let (fence, mut writer) = setup(&mut db, false).await;
    abandon_a_begin(&db, &fence, &mut writer, 13).await;

    let retried = fence.begin(&mut writer, "SKU-1", FencingToken::new(13));
    let err = tokio::time::timeout(Duration::from_secs(20), retried)
        .await
        .expect("the retry ends")
        .expect_err("the connection is refused");
    assert!(
        err.is_connection_unusable() && !err.is_stale(),
        "a newer token was refused as stale: {err}"
    );
    drop(writer);

    let mut fresh = db.connect().await;
    let mut tx = fence
        .begin(&mut fresh, "SKU-1", FencingToken::new(13))
        .await
        .expect("token 13 is newer than 12");
    tx.exec_drop(DECREMENT, ("writer-13",))
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    assert_eq!(db.sku().await, (97, Some("writer-13".into())));
}

/// mysql_async's own mark is cleared by the first command after the abandoned one, which
/// reads the abandoned answer as its own: a plain command of the caller's in between (a
/// ping-like `DO 1`, a read) made the fence trust the connection again on 940911f, and
/// the stale retry read answers one behind. The fence now decides only on answers that
/// carry a nonce of the statement just sent, which a lagging connection never returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_in_between_does_not_make_a_connection_owing_an_answer_usable() {
    let mut db = Db::start().await;
    let (fence, mut writer) = setup(&mut db, true).await;
    abandon_a_begin(&db, &fence, &mut writer, 11).await;

    // The caller's own command reads the abandoned upsert's answer.
    writer.query_drop("DO 1").await.expect("a plain command");
    assert!(!writer.is_disconnected(), "mysql_async trusts it again");

    // Two retries, same connection, same stale token: neither may commit.
    for attempt in 1..=2 {
        let retried = async {
            let mut tx = fence
                .begin(&mut writer, "SKU-1", FencingToken::new(11))
                .await?;
            tx.exec_drop(DECREMENT, ("stale-11",)).await?;
            tx.commit().await
        };
        let err = tokio::time::timeout(Duration::from_secs(20), retried)
            .await
            .expect("the retry ends")
            .expect_err("a stale token never passes");
        assert!(err.is_connection_unusable(), "attempt {attempt}: {err}");
    }
    drop(writer);
    assert_eq!(
        db.sku().await,
        (98, Some("holder-12".into())),
        "only writer 10 and holder 12 wrote"
    );
}
