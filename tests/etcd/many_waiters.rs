//! Many waiters of one session on one lock, on a 3-member cluster: every waiter gets its
//! turn. They share the session's watch of the lock; a waiter that subscribed after its
//! join's read must read again, or a deletion dispatched in between is lost and the waiter
//! waits forever (the short benchmark hung on exactly that).

use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_waiters_of_one_session_all_get_their_turns() {
    let cluster = EtcdCluster::builder()
        .members(3)
        .start()
        .await
        .expect("cluster");
    let locks = fencelock::etcd::EtcdLocker::connect(cluster.config(&namespace("many")))
        .await
        .expect("connect");
    // Rounds on fresh names: each starts with no watch open, the case that lost wake-ups.
    for round in 0..3 {
        let name = format!("busy-{round}");
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (locks, name) = (locks.clone(), name.clone());
                tokio::spawn(async move {
                    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(20));
                    let mut released = Vec::new();
                    for _ in 0..3 {
                        let guard = locks.lock(&name, &options).await?;
                        released.push(guard.release().await?);
                    }
                    Ok::<_, fencelock::LockError>(released)
                })
            })
            .collect();
        for task in tasks {
            let released = within(Duration::from_secs(30), "every waiter's turn", task)
                .await
                .expect("task")
                .expect("every lock granted");
            assert!(released.iter().all(|r| *r == ReleaseOutcome::Released));
        }
    }
}
