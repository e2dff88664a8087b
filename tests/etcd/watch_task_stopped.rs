//! The client's watch task serves every waiter of the client. If it stops (a panic in it,
//! here injected by aborting it), a waiter must be told with an error, not wait on a
//! watch nobody feeds until its wait timeout, or for ever without one.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_watch_task_stopped_gets_an_error() {
    let cluster = etcd().await;
    let ns = namespace("watch-task-stopped");
    let holder = locker(&cluster, &ns).await;
    let waiter = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("admin");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/x/")).await;

    let held = holder.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    // The waiter's client holds another lock: once nothing follows its key, it is not
    // held unobserved.
    let other = waiter.lock("h", &LockOptions::new()).await.expect("h");
    assert!(other.is_held());
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("x", &LockOptions::new()).await.map(drop) })
    };
    watch.next_put().await;

    waiter.stop_watch_task_for_test();
    let reason = within(Duration::from_secs(5), "the holder is told", other.lost()).await;
    assert_eq!(reason, LossReason::Unwatched);
    assert!(!other.is_held());
    let outcome = within(Duration::from_secs(5), "the waiter is told", waiting)
        .await
        .expect("task");
    let err = outcome.expect_err("no grant without a watch");
    assert!(err.to_string().contains("watch task"), "{err}");

    // A new wait on that client is refused at once too, rather than queued unserved.
    let again = within(
        Duration::from_secs(5),
        "a new waiter is told",
        waiter.lock("x", &LockOptions::new()),
    )
    .await
    .map(drop)
    .expect_err("refused");
    assert!(again.to_string().contains("watch task"), "{again}");
    // Neither left its key behind: the holder's is the only one.
    let keys = crate::support::keys(&mut admin, &format!("{ns}/x/")).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    drop(held);
}
