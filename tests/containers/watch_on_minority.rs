//! A waiter whose watch sits on a member that lost its peers (a minority that still
//! answers clients, with no leader) still gets the lock when the holder releases it:
//! watches are opened with require-leader, so that member cancels them, and the waiter
//! reads and watches again on a member that has a leader.

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{ContainerEtcdCluster, fetch_metrics, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions};

use super::locker_via;

/// How many watchers member `i` serves.
async fn watchers(cluster: &ContainerEtcdCluster, i: usize) -> f64 {
    let metrics = fetch_metrics(&cluster.endpoint(i)).await.expect("metrics");
    metric_sum(&metrics, "etcd_debugging_mvcc_watcher_total", &[])
}

/// How many watchers the three members serve in all.
async fn all_watchers(cluster: &ContainerEtcdCluster) -> f64 {
    let mut total = 0.0;
    for i in 0..3 {
        total += watchers(cluster, i).await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_watching_a_leaderless_member_gets_the_lock() {
    let cluster = ContainerEtcdCluster::start(3).await.expect("cluster");
    let leader = cluster.leader().await.expect("leader");
    let minority = (0..3).find(|i| *i != leader).expect("a follower");
    let healthy: Vec<usize> = (0..3).filter(|i| *i != minority).collect();
    let holder = locker_via(&cluster, &healthy).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(5));
    let watching_before = all_watchers(&cluster).await;
    let held = holder.lock("queue", &options).await.expect("lock");
    // The holder follows its own key on a watch of its own, asked for once the grant has
    // held 100 ms: wait for it, or it could be taken for a waiter's below.
    tokio::time::timeout(Duration::from_secs(5), async {
        while all_watchers(&cluster).await <= watching_before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the holder's watch opens");

    // A waiter that can use the member about to lose its peers and one healthy member;
    // start waiters until one's watch lands on the former (the client balances requests
    // over its endpoints).
    let mut attempt = 0;
    let (waiter, waiting) = loop {
        attempt += 1;
        assert!(
            attempt <= 20,
            "no waiter's watch landed on member {minority}"
        );
        let before = watchers(&cluster, minority).await;
        let before_healthy = watchers(&cluster, healthy[0]).await;
        let waiter: EtcdLocker = locker_via(&cluster, &[minority, healthy[0]]).await;
        let task = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move { waiter.lock("queue", &options).await })
        };
        // The waiter is queued and watching once one of the two members counts a watcher
        // more.
        let landed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if watchers(&cluster, minority).await > before {
                    return true;
                }
                if watchers(&cluster, healthy[0]).await > before_healthy {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the waiter watches somewhere");
        if landed {
            break (waiter, task);
        }
        task.abort();
        drop(waiter);
        // Its watch and queue key go before the next try.
        tokio::time::timeout(Duration::from_secs(5), async {
            while watchers(&cluster, healthy[0]).await > before_healthy {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the abandoned waiter's watch is cancelled");
    };

    cluster.isolate_from_peers(minority).expect("isolate");
    let released_at = tokio::time::Instant::now();
    assert_eq!(
        held.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted within a few election timeouts, not stalled")
        .expect("task")
        .expect("lock");
    eprintln!(
        "granted {:?} after the release, watch on the leaderless member",
        released_at.elapsed()
    );
    assert!(granted.is_held());
    cluster.rejoin_peers(minority).expect("rejoin");
    drop(granted);
    drop(waiter);
}
