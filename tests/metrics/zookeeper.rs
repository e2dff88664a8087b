//! ZooKeeper: grants, held locks, releases, and a loss (the node deleted behind the
//! holder's back) counted with its reason.

use std::time::Duration;

use fencelock::metrics::names;
use fencelock::testkit::ZooKeeperCluster;
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::recorded::recorded;

const ZOOKEEPER: (&str, &str) = ("backend", "zookeeper");

#[tokio::test]
async fn zookeeper_operations_are_counted() {
    let metrics = recorded();
    let server = ZooKeeperCluster::single().await.expect("zookeeper");
    let locks = ZooKeeperLocker::connect(server.config("metrics"))
        .await
        .expect("connect");
    let options = LockOptions::new();

    let held = locks.lock("m-zk", &options).await.expect("lock");
    assert_eq!(
        metrics.counter(names::GRANTS, &[ZOOKEEPER, ("lock", "m-zk")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ZOOKEEPER]), 1.0);
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[ZOOKEEPER, ("outcome", "released")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ZOOKEEPER]), 0.0);
    assert_eq!(metrics.samples(names::HOLD_SECONDS, &[ZOOKEEPER]).len(), 1);

    // A loss: an operator deletes the holder's node.
    let held = locks.lock("m-zk-lost", &options).await.expect("lock");
    let admin = server.client().await.expect("admin");
    admin.delete(held.path(), None).await.expect("delete");
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::KeyDeleted);
    assert_eq!(
        metrics.counter(names::LOSSES, &[ZOOKEEPER, ("reason", "key_deleted")]),
        1
    );
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[ZOOKEEPER, ("outcome", "not_held")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ZOOKEEPER]), 0.0);
}
