//! A release etcd refuses (the role lost its write permission while the lock was held)
//! leaves the key under the live lease. Its name must never serve a later acquisition:
//! a join would find the old key there and read it back as its own, and the earlier
//! grant's token would be handed out again (equal tokens pass the default fences).

use std::time::Duration;

use etcd_client::{Client, GetOptions, Permission};
use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, handled, namespace, within};

/// The role may read `<ns>/` but no longer write it.
async fn revoke_write(admin: &mut Client, ns: &str) {
    crate::support::revoke_namespace(admin, ns).await;
    admin
        .role_grant_permission("locker", Permission::read(format!("{ns}/")).with_prefix())
        .await
        .expect("grant read");
}

async fn restore_write(admin: &mut Client, ns: &str) {
    admin
        .role_grant_permission(
            "locker",
            Permission::read_write(format!("{ns}/")).with_prefix(),
        )
        .await
        .expect("grant again");
}

/// The create revision of `key`, if it exists.
async fn create_revision(admin: &mut Client, key: &str) -> Option<i64> {
    let read = admin.get(key, None).await.expect("read");
    read.kvs().first().map(|kv| kv.create_revision())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_again_after_a_refused_release_gets_a_newer_token() {
    let cluster = etcd().await;
    let ns = namespace("refused-release");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let locks = EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
        .await
        .expect("connect");
    let prefix = format!("{ns}/x/");
    let mut watch = PrefixWatch::start(&mut admin, &prefix).await;

    // A short TTL: the refused key goes with its retired session's lease (whose revoke
    // is refused too) if the sweep does not delete it first.
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let first = locks.lock("x", &options).await.expect("lock");
    let first_token = first.token();
    let key = watch.next_put().await;

    // Two refused deletes: the release's own, then the background removal that retries
    // it (both DeleteRange calls, or Txn calls if batched, handled by the member).
    revoke_write(&mut admin, &ns).await;
    let deletes =
        || async { handled(&cluster, "DeleteRange").await + handled(&cluster, "Txn").await };
    let before = deletes().await;
    let refused = first.release().await.expect_err("refused");
    assert!(refused.is_permission_denied(), "{refused}");
    within(
        Duration::from_secs(10),
        "the removal is refused too",
        async {
            while deletes().await < before + 2.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert_eq!(
        create_revision(&mut admin, &key).await,
        i64::try_from(first_token.get()).ok(),
        "the refused key stays"
    );

    // Allowed again: the same process takes the lock again. It must not be handed the
    // refused key (and its token) as a new grant.
    restore_write(&mut admin, &ns).await;
    let second = within(
        Duration::from_secs(20),
        "granted again",
        locks.lock("x", &options),
    )
    .await
    .expect("lock again");
    assert!(
        second.token() > first_token,
        "granted again with token {} after {first_token}",
        second.token()
    );
    // Granted once the refused key was gone: one key left, the new grant's.
    assert_eq!(
        create_revision(&mut admin, &key).await,
        None,
        "the old key is gone"
    );
    let queue = admin
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .expect("read queue");
    assert_eq!(queue.kvs().len(), 1, "one key: the new grant's");
    crate::support::released(second.release().await);
}
