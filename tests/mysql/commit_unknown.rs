//! A fenced transaction's `COMMIT` that gets no answer: its session is killed while the
//! `COMMIT` waits (here: for a global read lock an operator took; with a semi-synchronous
//! replica, the wait comes after the commit, and the same kill leaves it committed).
//! Before, `commit` answered `Database`, documented as "not committed", and a caller
//! that ran the transaction again could apply its write twice (equal tokens pass the
//! fence). Now it answers `CommitUnknown`: the client cannot know.

use std::time::Duration;

use fencelock::FencingToken;
use fencelock::mysql::Fence;
use fencelock::testkit::MariaDbServer;
use mysql_async::prelude::Queryable;

use crate::support::{DECREMENT, Db};

/// How long the test waits for the server to reach each state it waits for.
const BOUND: Duration = Duration::from_secs(20);

/// Stops the test's own server however the test ends.
struct Stop(&'static MariaDbServer);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.stop_and_remove();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_session_is_killed_is_unknown_not_failed() {
    // A server of its own: the read lock blocks every commit on the server. (Leaked to
    // be `'static` as the shared one is; stopped by `Stop`.)
    let server: &'static MariaDbServer = Box::leak(Box::new(
        MariaDbServer::start().await.expect("start mariadbd"),
    ));
    let _stop = Stop(server);
    let name = server.create_database().await.expect("create database");
    let conn = server.connect(&name).await.expect("connect");
    let mut db = Db { server, name, conn };
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&mut db.conn).await.expect("schema");

    let mut writer = db.connect().await;
    let writer_id = writer.id();
    let (written_tx, written) = tokio::sync::oneshot::channel();
    let (blocked_tx, blocked) = tokio::sync::oneshot::channel::<()>();
    let committing = {
        let fence = fence.clone();
        tokio::spawn(async move {
            let mut tx = fence
                .begin(&mut writer, "SKU-1", FencingToken::new(10))
                .await
                .expect("passes");
            tx.exec_drop(DECREMENT, ("fenced",)).await.expect("write");
            let _ = written_tx.send(());
            blocked.await.expect("the lock was taken");
            tx.commit().await
        })
    };
    written.await.expect("the write was made");
    // An operator's global read lock: commits wait for it.
    let mut operator = db.connect().await;
    operator
        .query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .expect("FTWRL");
    blocked_tx.send(()).expect("the writer waits for the lock");
    tokio::time::timeout(BOUND, async {
        loop {
            let waiting: Option<u64> = db
                .conn
                .exec_first(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE ID = ? AND INFO = 'COMMIT'",
                    (writer_id,),
                )
                .await
                .expect("PROCESSLIST");
            if waiting.unwrap_or(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the writer's COMMIT waits for the read lock");
    db.conn
        .query_drop(format!("KILL CONNECTION {writer_id}"))
        .await
        .expect("KILL");

    let err = tokio::time::timeout(BOUND, committing)
        .await
        .expect("commit returns once the session ends")
        .expect("the committing task")
        .expect_err("no answer came");
    assert!(err.is_commit_unknown(), "{err}");
    operator
        .query_drop("UNLOCK TABLES")
        .await
        .expect("UNLOCK TABLES");
    // Here the kill came before the commit (it waited for the lock): nothing applied.
    // The client could not tell, which is what the error says.
    assert_eq!(db.sku().await, (100, None));
}
