//! A fenced transaction's `COMMIT` whose answer never comes: the server committed it, then
//! the session ended before it could say so (here: the commit waits for a synchronous
//! standby, committed locally first, and an operator terminates the session). Before,
//! `commit` answered `Database`, documented as "not committed", and a caller that ran
//! the transaction again passed the fence a second time with the same token (equal
//! tokens are accepted) and applied its write twice. Now it answers `CommitUnknown`,
//! and `Fence::commit_status` tells what became of it.

use std::time::Duration;

use fencelock::FencingToken;
use fencelock::postgres::{CommitStatus, Fence, FenceError};
use tokio_postgres::Client;

use crate::support::{DECREMENT, Db};

/// How long the test waits for the server to reach each state it waits for.
const BOUND: Duration = Duration::from_secs(20);

/// Waits until `check` holds, asking the server every 10 ms (the states waited for are
/// server-side; no event reaches the client for them).
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    tokio::time::timeout(BOUND, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within {BOUND:?}"));
}

async fn setting(client: &Client, name: &str) -> String {
    client
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .expect("SHOW")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_unknown_and_can_be_asked_about() {
    let db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&db.client).await.expect("schema");

    // Every synchronous commit from now on waits for a standby that never comes, committed
    // locally first (this test's own server).
    db.client
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nowhere'")
        .await
        .expect("ALTER SYSTEM");
    db.client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let mut writer = db.connect().await;
    let pid: i32 = writer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    // The test servers turn synchronous commit off (speed); this session turns it on.
    writer
        .batch_execute("SET synchronous_commit = on")
        .await
        .expect("SET");
    until("the writer's session reads the new setting", || async {
        setting(&writer, "synchronous_standby_names").await == "nowhere"
    })
    .await;

    let committing = {
        let fence = fence.clone();
        tokio::spawn(async move {
            let tx = fence
                .begin(&mut writer, "SKU-1", FencingToken::new(10))
                .await
                .expect("passes");
            tx.execute(DECREMENT, &[&"fenced"]).await.expect("write");
            tx.commit().await
        })
    };
    until("the commit waits for the standby", || async {
        let row = db
            .client
            .query_opt(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity")
            .expect("the writer's session is alive");
        row.get::<_, Option<String>>(0).as_deref() == Some("SyncRep")
    })
    .await;
    // An operator ends the session: committed locally, it never answers the COMMIT.
    db.client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");

    let err = tokio::time::timeout(BOUND, committing)
        .await
        .expect("commit returns once the session ends")
        .expect("the committing task")
        .expect_err("no answer came");
    assert!(err.is_commit_unknown(), "{err}");
    let FenceError::CommitUnknown { xid, .. } = err else {
        unreachable!("checked above")
    };
    // It was committed: the write and the fence together. Running it again would apply
    // the write twice.
    assert_eq!(
        fence.commit_status(&db.client, xid).await.expect("status"),
        CommitStatus::Committed
    );
    assert_eq!(db.sku().await, (99, Some("fenced".to_owned())));
    assert_eq!(
        fence.current(&db.client, "SKU-1").await.expect("read"),
        Some(FencingToken::new(10))
    );
}

#[tokio::test]
async fn the_status_of_a_rolled_back_transaction_is_aborted() {
    let db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&db.client).await.expect("schema");
    let mut client = db.connect().await;
    let tx = fence
        .begin(&mut client, "SKU-1", FencingToken::new(10))
        .await
        .expect("passes");
    let xid: i64 = tx
        .query_one("SELECT txid_current()", &[])
        .await
        .expect("xid")
        .get(0);
    tx.rollback().await.expect("rollback");
    assert_eq!(
        fence.commit_status(&db.client, xid).await.expect("status"),
        CommitStatus::Aborted
    );
    assert_eq!(db.sku().await, (100, None));
}
