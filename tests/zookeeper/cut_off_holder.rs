//! A holder cut off from ZooKeeper (its traffic frozen by a fault proxy, as a partition or a
//! paused process would) reports the loss by its local deadline, before the server expires
//! its session and hands the lock on; the next holder's czxid token is larger, and
//! PostgreSQL's fence refuses the stale holder's write.

use std::time::Duration;

use fencelock::postgres::{Fence, FenceError};
use fencelock::testkit::{FaultProxy, PostgresServer};
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::{locker, namespace, shared, within};

const WRITE: &str =
    "UPDATE inventory SET available = available - 1, written_by = $1 WHERE sku = 'SKU-1'";

async fn fenced_write(
    db: &mut tokio_postgres::Client,
    token: FencingToken,
    writer: &str,
) -> Result<(), FenceError> {
    let tx = Fence::new().begin(db, "SKU-1", token).await?;
    tx.execute(WRITE, &[&writer]).await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cut_off_holder_knows_first_and_its_write_is_refused() {
    let cluster = shared();
    let ns = namespace("cut-off");
    let postgres = PostgresServer::start().await.expect("postgres");
    let database = postgres.create_database().await.expect("database");
    let mut db = postgres.connect(&database).await.expect("connect");
    db.batch_execute(
        "CREATE TABLE inventory (sku text PRIMARY KEY, available int NOT NULL, written_by text); \
         INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100);",
    )
    .await
    .expect("table");
    Fence::new().ensure_schema(&db).await.expect("fence schema");

    let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
        .await
        .expect("proxy");
    let a_config = cluster
        .config(&ns)
        .with_hosts(proxy.address().to_string())
        .with_request_timeout(Duration::from_millis(500));
    let a = ZooKeeperLocker::connect(a_config)
        .await
        .expect("A connects");
    let b = locker(cluster, &ns).await;
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_wait_timeout(Duration::from_secs(20));

    let stale = a.lock("SKU-1", &options).await.expect("A locks");
    let t1 = stale.token();
    proxy.pause();
    let b_waits = tokio::spawn(async move {
        let guard = b.lock("SKU-1", &options).await;
        (guard, Instant::now())
    });

    let reason = within(Duration::from_secs(5), "A's loss", stale.lost()).await;
    let a_knew = Instant::now();
    assert_eq!(
        reason,
        LossReason::Expired,
        "the local deadline, not the server"
    );
    assert!(!stale.is_held());
    let (next, b_granted) = within(Duration::from_secs(15), "B's grant", b_waits)
        .await
        .expect("B's task");
    let next = next.expect("B locks once A's session expired");
    assert!(
        a_knew <= b_granted,
        "A learnt of its loss {:?} after B was granted the lock",
        a_knew - b_granted
    );
    let t2 = next.token();
    assert!(t2 > t1, "t2 {t2} must be newer than t1 {t1}");
    fenced_write(&mut db, t2, "B").await.expect("B writes");

    proxy.resume();
    let err = fenced_write(&mut db, t1, "A")
        .await
        .expect_err("A's write must be refused");
    assert!(
        matches!(err, FenceError::Stale { presented, current, .. } if presented == t1 && current == t2),
        "{err}"
    );
    assert_eq!(
        stale.release().await.expect("release answers"),
        ReleaseOutcome::NotHeld
    );
    assert!(next.is_held(), "A's late release left B's lock alone");
    let _ = next.release().await;
}
