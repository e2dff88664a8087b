//! The backend contract (`fencelock::testkit::conformance`) on a standalone server and on a
//! 3-member ensemble: three clients each, the holder's node deleted behind its back.

use std::pin::Pin;
use std::time::Duration;

use fencelock::testkit::ZooKeeperCluster;
use fencelock::testkit::conformance::Contract;
use fencelock::zookeeper::ZooKeeperGuard;
use zookeeper_client::Client;

use crate::support::{admin, locker, namespace, shared};

/// Deletes the holder's node (an operator's `delete`).
fn delete_node(
    admin: Client,
) -> impl Fn(&ZooKeeperGuard) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    move |guard: &ZooKeeperGuard| {
        let (admin, path) = (admin.clone(), guard.path().to_owned());
        Box::pin(async move {
            admin.delete(&path, None).await.expect("delete the node");
        })
    }
}

async fn keeps_the_contract(cluster: &ZooKeeperCluster, test: &str) {
    let ns = namespace(test);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(locker(cluster, &ns).await);
    }
    Contract::new(clients)
        .with_ttl(Duration::from_secs(1))
        .with_take_away(delete_node(admin(cluster).await))
        .run_all()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_keeps_the_backend_contract() {
    keeps_the_contract(shared(), "contract").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_ensemble_keeps_the_backend_contract() {
    let ensemble = ZooKeeperCluster::start(3)
        .await
        .expect("start the ensemble");
    let mut modes = Vec::new();
    for i in 0..3 {
        modes.push(ensemble.mode(i).await.expect("member serves"));
    }
    modes.sort();
    assert_eq!(modes, ["follower", "follower", "leader"], "a real ensemble");
    keeps_the_contract(&ensemble, "contract-ensemble").await;
}
