//! One etcd revision can delete many keys: an operator's `etcdctl del --prefix` on a lock
//! (or a revoked lease shared by several keys) deletes the holder's key and the waiters'
//! keys at once. A waiter decides on the whole revision: one whose own key went in it is
//! not granted, whatever else that revision deleted.

use std::time::Duration;

use etcd_client::DeleteOptions;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_goes_with_the_holders_in_one_revision_is_not_granted() {
    let cluster = etcd().await;
    let ns = namespace("prefix-delete");
    let prefix = format!("{ns}/x/");
    let locks = locker(&cluster, &ns).await;
    let newcomer = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &prefix).await;

    // A first handoff opens the session's watch of the lock (it stays open a while), so
    // the waiter below subscribes before it joins and starts from its join's own read:
    // it is in line, following deletions, before the operator acts.
    let first = locks.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let second = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("x", &LockOptions::new()).await })
    };
    watch.next_put().await;
    crate::support::released(first.release().await);
    let second = second.await.expect("task").expect("second");
    crate::support::released(second.release().await);
    watch.next().await;
    watch.next().await;

    // Holder and waiter share one session: their keys sort holder first, so the
    // holder's deletion comes first in the revision that deletes both.
    let held = locks.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("x", &LockOptions::new()).await })
    };
    watch.next_put().await;

    // The operator clears the lock.
    client
        .delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("prefix delete");

    let outcome = within(Duration::from_secs(10), "the waiter hears", waiting)
        .await
        .expect("task");
    let err = match outcome {
        Ok(guard) => panic!(
            "the waiter was granted although its key {} was deleted",
            guard.key()
        ),
        Err(err) => err,
    };
    assert!(err.is_lost(), "{err}");
    assert!(
        matches!(
            err,
            fencelock::LockError::LeaseLost {
                reason: LossReason::KeyDeleted,
                ..
            }
        ),
        "{err:?}"
    );
    // The holder learns it too, and the lock is free for anyone.
    assert_eq!(
        within(Duration::from_secs(5), "the holder hears", held.lost()).await,
        LossReason::KeyDeleted
    );
    assert!(!held.is_held());
    let granted = newcomer
        .lock(
            "x",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock is free");
    crate::support::released(granted.release().await);
}
