//! The article's central story, end to end, on MariaDB with etcd tokens. Client A takes
//! the lock (token t1) and is cut off from etcd past its lease (a fault proxy freezes its
//! traffic, as a partition or a long pause would). Client B takes the lock (t2 > t1) and
//! writes. A comes back and writes with t1: MariaDB refuses it, and the data shows only
//! B's write.

use std::time::Duration;

use fencelock::mysql::{Fence, FenceError};
use fencelock::testkit::{EtcdCluster, FaultProxy};
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions};
use mysql_async::prelude::Queryable;

use crate::support::{DECREMENT, Db};

async fn fenced_write(db: &mut Db, token: FencingToken, writer: &str) -> Result<(), FenceError> {
    let mut tx = Fence::new().begin(&mut db.conn, "SKU-1", token).await?;
    tx.exec_drop(DECREMENT, (writer,)).await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_the_stale_holders_write_is_refused() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let address = etcd
        .endpoint(0)
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(address).await.expect("proxy");
    let a = fencelock::etcd::EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace("story")
            .with_request_timeout(Duration::from_secs(1)),
    )
    .await
    .expect("A connects");
    let b = fencelock::etcd::EtcdLocker::connect(etcd.config("story"))
        .await
        .expect("B connects");

    let mut db = Db::start().await;
    db.inventory().await;
    Fence::new()
        .ensure_schema(&mut db.conn)
        .await
        .expect("schema");
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_wait_timeout(Duration::from_secs(15));

    let stale = a.lock("SKU-1", &options).await.expect("A locks");
    let t1 = stale.token();
    proxy.pause(); // A can no longer reach etcd
    // A's guard notices, but A is about to write anyway (a write already on its way, or a
    // process that was frozen and does not know yet).
    tokio::time::timeout(Duration::from_secs(10), stale.lost())
        .await
        .expect("A's guard reports the loss");
    let next = b
        .lock("SKU-1", &options)
        .await
        .expect("B locks once A's lease is gone");
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
        db.sku().await,
        (99, Some("B".into())),
        "only B's write is stored"
    );
    drop(next);
}
