//! A holder whose server is a follower cut off from the leader (the follower's link to the
//! leader's quorum port cut by a fault proxy, the holder's own connection untouched)
//! reports its loss before the leader expires its session and grants the lock to the next
//! client. The follower keeps answering its clients for `syncLimit` ticks (2 s here) after
//! it lost the leader: a heartbeat it can answer alone (a read) would keep the holder's
//! local deadline moving while the leader, which hears nothing of the session any more,
//! expires it after one session timeout (1 s here) and hands the lock on.

use std::time::Duration;

use fencelock::testkit::ZooKeeperCluster;
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};
use tokio::time::Instant;

use crate::support::{namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_off_from_the_leader_knows_before_the_next_grant() {
    let cluster = ZooKeeperCluster::start_with_peer_links(3)
        .await
        .expect("ensemble");
    let leader = cluster.leader().await.expect("a leader");
    let follower = (0..cluster.len())
        .find(|&i| i != leader)
        .expect("a follower");
    let ns = namespace("follower-cut-off");
    let on = |member: usize| {
        cluster
            .config(&ns)
            .with_hosts(cluster.address(member))
            .with_request_timeout(Duration::from_millis(500))
    };
    let holder = ZooKeeperLocker::connect(on(follower))
        .await
        .expect("the holder connects to the follower");
    let next = ZooKeeperLocker::connect(on(leader))
        .await
        .expect("the next client connects to the leader");
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(1))
        .with_wait_timeout(Duration::from_secs(20));

    let held = holder
        .lock("job", &options)
        .await
        .expect("the holder locks");
    let first = held.token();
    // While the follower reaches the leader, the heartbeats keep the lock: three session
    // timeouts pass without a loss (a deadline set from an earlier heartbeat than the last
    // must still stay ahead).
    let kept = tokio::time::timeout(Duration::from_secs(3), held.lost()).await;
    assert!(kept.is_err(), "lost while connected: {kept:?}");
    assert!(held.is_held());
    cluster
        .cut_off_from_leader(follower, leader)
        .expect("cut the follower off");
    let waiting = tokio::spawn(async move {
        let granted = next.lock("job", &options).await;
        (granted, Instant::now(), next)
    });

    let reason = within(Duration::from_secs(10), "the holder's loss", held.lost()).await;
    let knew = Instant::now();
    assert_eq!(reason, LossReason::Expired, "the local deadline");
    let (granted, granted_at, _next) = within(Duration::from_secs(15), "the next grant", waiting)
        .await
        .expect("the next client's task");
    let granted = granted.expect("granted once the leader expired the holder's session");
    assert!(
        knew <= granted_at,
        "the holder learnt of its loss {:?} after the next client was granted the lock",
        knew - granted_at
    );
    eprintln!(
        "the holder knew {:?} before the next grant",
        granted_at - knew
    );
    assert!(granted.token() > first);
    let _ = granted.release().await;
}
