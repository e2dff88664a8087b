//! A ZooKeeper session's monitor keeps its local deadline and reports its loss. If it
//! stops (a panic in it; here it is aborted, as a panic would end it), the guards must
//! hear `Unrenewed` at once, and the session must close from this side: left to the
//! client library, it would go on pinging a session whose guards all read as lost, its
//! lock node blocking the next holder for as long as the guard lived.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{locker, namespace, shared, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_monitor_reports_the_loss_and_closes_the_session() {
    let cluster = shared();
    let ns = namespace("monitor-stopped");
    let first = locker(cluster, &ns).await;
    let second = locker(cluster, &ns).await;
    let guard = first.lock("job", &LockOptions::new()).await.expect("lock");
    guard.stop_session_monitor_for_test();
    let reason = within(Duration::from_secs(10), "the loss", guard.lost()).await;
    assert_eq!(reason, LossReason::Unrenewed);
    assert!(!guard.is_held());
    // The guard still lives; its session is closed all the same, its node gone.
    let next = second
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(20)),
        )
        .await
        .expect("the next holder gets the lock");
    assert!(next.token() > guard.token());
    drop(guard);
}
