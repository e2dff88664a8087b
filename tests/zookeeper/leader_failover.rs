//! The leader of a 3-member ensemble is killed while a lock is held: the holder keeps it
//! (its session moves to another member within the session timeout), nobody else gets it
//! meanwhile, and the next grant's czxid (a zxid of the new leader's epoch) is larger.

use std::time::Duration;

use fencelock::testkit::ZooKeeperCluster;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_and_its_token_order_survive_a_leader_failover() {
    let mut ensemble = ZooKeeperCluster::start(3).await.expect("ensemble");
    let ns = namespace("failover");
    let (a, b) = (locker(&ensemble, &ns).await, locker(&ensemble, &ns).await);
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(6))
        .with_wait_timeout(Duration::from_secs(20));
    let held = a.lock("ledger", &options).await.expect("A locks");
    let before = held.token();

    let leader = ensemble.leader().await.expect("a leader");
    ensemble.kill(leader).expect("kill the leader");
    // B's acquisition goes through the new leader: it cannot be granted while A holds.
    let b_waits = tokio::spawn(async move {
        let guard = b.lock("ledger", &options).await;
        (b, guard)
    });
    let missed = within(
        Duration::from_secs(15),
        "a try_lock after the failover",
        async {
            loop {
                match a.try_lock("ledger", &LockOptions::new()).await {
                    Ok(missed) => return missed,
                    // The ensemble is electing: not an answer yet.
                    Err(err) if err.is_unavailable() => continue,
                    Err(err) => panic!("try_lock: {err}"),
                }
            }
        },
    )
    .await;
    assert!(missed.is_none(), "granted twice across the failover");
    assert!(held.is_held(), "A's lock outlived the failover");
    if b_waits.is_finished() {
        let (_b, outcome) = b_waits.await.expect("task");
        match outcome {
            Ok(guard) => panic!(
                "B was granted (token {}) while A held the lock",
                guard.token()
            ),
            Err(err) => panic!("B's wait did not ride out the failover: {err}"),
        }
    }

    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (_b, next) = within(Duration::from_secs(15), "B's grant", b_waits)
        .await
        .expect("task");
    let next = next.expect("B locks after A released");
    assert!(
        next.token() > before,
        "token {} after the failover is not above {before}",
        next.token()
    );
    assert!(
        next.token().get() >> 32 > before.get() >> 32,
        "the new leader's epoch is in the token"
    );
    let _ = next.release().await;
}
