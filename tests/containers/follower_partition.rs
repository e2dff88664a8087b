//! A client whose only way to the cluster is one follower is cut off with it, while the
//! other two keep the cluster going: its guard reports the loss no later than its lease
//! ends, that is before the lock is granted to a client on the healthy side.

use std::time::Duration;

use fencelock::testkit::ContainerEtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions};

use super::locker_via;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_with_its_member_reports_the_loss_before_the_next_grant() {
    let cluster = ContainerEtcdCluster::start(3).await.expect("cluster");
    let leader = cluster.leader().await.expect("leader");
    let follower = (0..3).find(|i| *i != leader).expect("a follower");
    let healthy: Vec<usize> = (0..3).filter(|i| *i != follower).collect();

    let cut_off = locker_via(&cluster, &[follower]).await;
    let other = locker_via(&cluster, &healthy).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let forever = options.clone().wait_forever();
    let held = cut_off
        .lock("client-partition", &options)
        .await
        .expect("lock");

    cluster.partition(follower).expect("partition");
    let waiting = other.lock("client-partition", &forever);
    tokio::pin!(waiting);
    tokio::select! {
        biased;
        _ = held.lost() => {}
        granted = &mut waiting => panic!("granted ({granted:?}) before the holder knew"),
    }
    let next = waiting.await.expect("the healthy side gets the lock");
    assert!(next.token() > held.token());
    // The cluster itself never lost its leader.
    assert_eq!(cluster.leader().await.expect("leader"), leader);

    cluster.heal(follower).expect("heal");
    assert_eq!(
        next.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
}
