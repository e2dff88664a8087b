//! A holder whose key is deleted under its live lease (an operator, a late request, a
//! bug elsewhere) must stop believing it holds the lock: the next waiter holds it now.
//! Every primitive's guard turns `is_held()` false and resolves `lost()` with
//! `LossReason::KeyDeleted`, from the lock's shared watch (no watch of its own).

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{delete_and_expect_loss, etcd, locker, namespace, within};

async fn setup(test: &str) -> (fencelock::testkit::EtcdCluster, EtcdLocker) {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace(test)).await;
    (cluster, locks)
}

#[tokio::test]
async fn a_lock_holder_learns_its_key_was_deleted() {
    let (cluster, locks) = setup("deleted-lock").await;
    let guard = locks.lock("x", &LockOptions::new()).await.expect("lock");
    delete_and_expect_loss(&cluster, &guard).await;
    // Its release now says so, and deletes nothing.
    assert_eq!(
        guard.release().await.expect("release"),
        fencelock::ReleaseOutcome::NotHeld
    );
}

#[tokio::test]
async fn a_lock_taken_with_try_lock_learns_its_key_was_deleted() {
    let (cluster, locks) = setup("deleted-try").await;
    let guard = locks
        .try_lock("x", &LockOptions::new())
        .await
        .expect("try_lock")
        .expect("free");
    delete_and_expect_loss(&cluster, &guard).await;
}

#[tokio::test]
async fn a_holder_that_waited_learns_its_key_was_deleted() {
    let (cluster, locks) = setup("deleted-waited").await;
    let first = locks.lock("x", &LockOptions::new()).await.expect("lock");
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("x", &LockOptions::new()).await })
    };
    // The waiter gets the lock through the watch it waited on.
    let mut client = cluster.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(locks.config().namespace(), "x");
    let mut watch = crate::support::PrefixWatch::start(&mut client, &prefix).await;
    if crate::support::keys(&mut client, &prefix).await.len() < 2 {
        watch.next_put().await;
    }
    crate::support::released(first.release().await);
    let second = within(Duration::from_secs(5), "the waiter's turn", waiting)
        .await
        .expect("task")
        .expect("lock");
    delete_and_expect_loss(&cluster, &second).await;
}

#[tokio::test]
async fn a_semaphore_permit_learns_its_key_was_deleted() {
    let (cluster, locks) = setup("deleted-permit").await;
    let semaphore = locks.semaphore("x", 2).expect("semaphore");
    let one = semaphore
        .acquire(&LockOptions::new())
        .await
        .expect("permit");
    let two = semaphore
        .acquire(&LockOptions::new())
        .await
        .expect("permit");
    delete_and_expect_loss(&cluster, &two).await;
    // The other permit is untouched.
    assert!(one.is_held());
}

#[tokio::test]
async fn readers_and_writers_learn_their_key_was_deleted() {
    let (cluster, locks) = setup("deleted-rw").await;
    let rw = locks.rwlock("x").expect("rwlock");
    let reading = rw.read(&LockOptions::new()).await.expect("read");
    delete_and_expect_loss(&cluster, &reading).await;
    let writing = rw.write(&LockOptions::new()).await.expect("write");
    delete_and_expect_loss(&cluster, &writing).await;
}

#[tokio::test]
async fn a_leader_learns_its_candidacy_was_deleted() {
    let (cluster, locks) = setup("deleted-leader").await;
    let election = locks.election("x").expect("election");
    let leading = election
        .campaign("me", &LockOptions::new())
        .await
        .expect("campaign");
    delete_and_expect_loss(&cluster, leading.guard()).await;
    assert!(!leading.is_leader());
    assert_eq!(leading.lost().await, LossReason::KeyDeleted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_is_deleted_is_told_so_not_that_its_lease_is_gone() {
    let (cluster, locks) = setup("deleted-waiter").await;
    let prefix = fencelock::etcd::lock_prefix(locks.config().namespace(), "x");
    let mut client = cluster.client().await.expect("client");
    let mut watch = crate::support::PrefixWatch::start(&mut client, &prefix).await;
    let held = locks.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("x", &LockOptions::new()).await.map(drop) })
    };
    let queued = watch.next_put().await;
    client.delete(queued.as_str(), None).await.expect("delete");
    let err = within(Duration::from_secs(5), "the waiter hears", waiting)
        .await
        .expect("task")
        .expect_err("its key is gone");
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
    // The session itself is fine: the holder still holds.
    assert!(held.is_held());
    crate::support::released(held.release().await);
}
