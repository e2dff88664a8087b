//! Tests on containers (feature `containers`): a real 3-member etcd cluster on a Docker
//! network, true network partitions, and the compose deployment. They need a Docker engine
//! and the images of `compose/build-local-images.sh` (`.ci/run` builds them).

mod compose;
mod compose_bench;
mod compose_tls;
mod follower_partition;
mod leader_partition;
mod sentinel_failover;
mod watch_on_minority;

use std::time::Duration;

use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::testkit::ContainerEtcdCluster;

/// A locker that reaches the cluster only through the members in `members`.
pub async fn locker_via(cluster: &ContainerEtcdCluster, members: &[usize]) -> EtcdLocker {
    let endpoints: Vec<String> = members.iter().map(|i| cluster.endpoint(*i)).collect();
    EtcdLocker::connect(
        EtcdConfig::new(endpoints)
            .with_namespace("containers")
            .with_connect_timeout(Duration::from_secs(5))
            .with_request_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect")
}
