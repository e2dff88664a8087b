//! Helpers shared by the ZooKeeper tests.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fencelock::testkit::ZooKeeperCluster;
use fencelock::zookeeper::ZooKeeperLocker;
use zookeeper_client::Client;

/// The standalone server the tests that do not break it share.
pub fn shared() -> &'static ZooKeeperCluster {
    ZooKeeperCluster::shared()
}

/// A namespace no other test uses.
pub fn namespace(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("/test-{test}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub async fn locker(cluster: &ZooKeeperCluster, namespace: &str) -> ZooKeeperLocker {
    ZooKeeperLocker::connect(cluster.config(namespace))
        .await
        .expect("connect to zookeeper")
}

/// The test's own client, for reads and deletes behind the lockers' backs.
pub async fn admin(cluster: &ZooKeeperCluster) -> Client {
    cluster.client().await.expect("admin client")
}

/// The children of `dir`, sorted; none if it does not exist.
pub async fn children(admin: &Client, dir: &str) -> Vec<String> {
    match admin.list_children(dir).await {
        Ok(mut children) => {
            children.sort();
            children
        }
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(err) => panic!("listing {dir}: {err}"),
    }
}

/// Waits (by child watches, no polling) until `dir` has `count` children; returns them.
pub async fn await_children(admin: &Client, dir: &str, count: usize) -> Vec<String> {
    within(Duration::from_secs(10), "the queue to change", async {
        loop {
            match admin.get_and_watch_children(dir).await {
                Ok((mut children, _, watcher)) => {
                    if children.len() == count {
                        children.sort();
                        return children;
                    }
                    watcher.changed().await;
                }
                Err(zookeeper_client::Error::NoNode) => {
                    if count == 0 {
                        return Vec::new();
                    }
                    // Not created yet: wait for it.
                    let (_, watcher) = admin.check_and_watch_stat(dir).await.expect("watch");
                    watcher.changed().await;
                }
                Err(err) => panic!("watching {dir}: {err}"),
            }
        }
    })
    .await
}

/// Fails the test if `future` takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}
