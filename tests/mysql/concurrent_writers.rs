//! Concurrent fenced writers. A stale writer that arrives while a newer holder's
//! transaction is open waits for it, then is refused: the check and the write are atomic.
//! Many writers with interleaved tokens on a resource no one has written yet: no deadlock,
//! and the accepted writes, in the order they took effect, carry increasing tokens.
//! Under REPEATABLE READ and READ COMMITTED.

use std::sync::Arc;
use std::time::Duration;

use fencelock::FencingToken;
use fencelock::mysql::{Fence, FenceError};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel};
use tokio::sync::oneshot;

use crate::support::{DECREMENT, Db, LEVELS, until_a_writer_waits_for_the_lock};

/// A fenced writer on a connection of its own: begins with `token`, writes, tells
/// `passed` (if any) that it holds the fence, and commits when `go` (if any) fires.
async fn fenced(
    fence: Arc<Fence>,
    mut conn: Conn,
    token: u64,
    passed: Option<oneshot::Sender<()>>,
    go: Option<oneshot::Receiver<()>>,
) -> Result<(), FenceError> {
    let mut tx = fence
        .begin(&mut conn, "SKU-1", FencingToken::new(token))
        .await?;
    tx.exec_drop(DECREMENT, (format!("holder-{token}"),))
        .await?;
    if let Some(passed) = passed {
        let _ = passed.send(());
    }
    if let Some(go) = go {
        let _ = go.await;
    }
    tx.commit().await
}

async fn a_stale_writer_waits_for_the_newer_holder_then_loses(level: IsolationLevel) {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Arc::new(Fence::new());
    fence.ensure_schema(&mut db.conn).await.expect("schema");

    // The newer holder (12) passes the fence and writes, and does not commit yet.
    let (passed, newer_passed) = oneshot::channel();
    let (commit_newer, go) = oneshot::channel();
    let newer = tokio::spawn(fenced(
        fence.clone(),
        db.connect_at(level).await,
        12,
        Some(passed),
        Some(go),
    ));
    newer_passed
        .await
        .expect("the newer holder passes the fence");
    // The stale one (11) arrives now: it must queue on the fence row, not pass it.
    let stale = tokio::spawn(fenced(
        fence.clone(),
        db.connect_at(level).await,
        11,
        None,
        None,
    ));
    until_a_writer_waits_for_the_lock(&mut db).await;
    assert!(
        !stale.is_finished(),
        "{level:?}: the stale writer is queued"
    );
    commit_newer.send(()).expect("signal");
    newer
        .await
        .expect("task")
        .expect("the newer holder commits");
    let err = stale
        .await
        .expect("task")
        .expect_err("the stale writer is refused");
    assert!(
        matches!(err, FenceError::Stale { presented, current, .. }
            if presented == FencingToken::new(11) && current == FencingToken::new(12)),
        "{level:?}: {err}"
    );
    assert_eq!(db.sku().await, (99, Some("holder-12".into())), "{level:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_waits_then_loses_under_repeatable_read() {
    a_stale_writer_waits_for_the_newer_holder_then_loses(IsolationLevel::RepeatableRead).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_waits_then_loses_under_read_committed() {
    a_stale_writer_waits_for_the_newer_holder_then_loses(IsolationLevel::ReadCommitted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_writer_waits_for_the_older_then_wins() {
    for level in LEVELS {
        let mut db = Db::start().await;
        db.inventory().await;
        let fence = Arc::new(Fence::new());
        fence.ensure_schema(&mut db.conn).await.expect("schema");
        let (passed, older_passed) = oneshot::channel();
        let (commit_older, go) = oneshot::channel();
        let older = tokio::spawn(fenced(
            fence.clone(),
            db.connect_at(level).await,
            11,
            Some(passed),
            Some(go),
        ));
        older_passed
            .await
            .expect("the older holder passes the fence");
        let newer = tokio::spawn(fenced(
            fence.clone(),
            db.connect_at(level).await,
            12,
            None,
            None,
        ));
        until_a_writer_waits_for_the_lock(&mut db).await;
        assert!(
            !newer.is_finished(),
            "{level:?}: the newer writer is queued"
        );
        commit_older.send(()).expect("signal");
        older
            .await
            .expect("task")
            .expect("the older holder commits first");
        newer.await.expect("task").expect("then the newer one");
        assert_eq!(db.sku().await, (98, Some("holder-12".into())), "{level:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_tokens_take_effect_in_increasing_order() {
    for level in LEVELS {
        let mut db = Db::start().await;
        db.inventory().await;
        let fence = Arc::new(Fence::new());
        fence.ensure_schema(&mut db.conn).await.expect("schema");
        // Each accepted write appends its token; the auto-increment id is the order in
        // which the writes took effect (they are serialised by the fence row).
        db.conn
            .query_drop(
                "CREATE TABLE applied (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
            )
            .await
            .expect("create applied");

        // Tokens 1..=24 in a scrambled but fixed order, all at once, on a resource no
        // one has written yet (its fence row does not exist).
        let tokens: Vec<u64> = (0..24u64).map(|i| (i * 7) % 24 + 1).collect();
        let mut tasks = Vec::new();
        for token in tokens {
            let mut conn = db.connect_at(level).await;
            let fence = fence.clone();
            tasks.push(tokio::spawn(async move {
                let mut tx = match fence
                    .begin(&mut conn, "new-resource", FencingToken::new(token))
                    .await
                {
                    Ok(tx) => tx,
                    Err(err) if err.is_stale() => return false,
                    Err(err) => panic!("token {token}: unexpected {err}"),
                };
                tx.exec_drop("INSERT INTO applied (token) VALUES (?)", (token,))
                    .await
                    .expect("write");
                // Hold the fence a moment, so that others queue behind it.
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
            "{level:?}: accepted writes went backwards: {applied:?}"
        );
        assert_eq!(
            applied.last(),
            Some(&24),
            "{level:?}: the newest token wrote last"
        );
        assert_eq!(
            fence
                .current(&mut db.conn, "new-resource")
                .await
                .expect("read"),
            Some(FencingToken::new(24))
        );
    }
}
