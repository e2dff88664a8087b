//! A `lock_all`'s release etcd refuses (the role lost its write permission while the
//! locks were held): the one transaction fails whole, and each guard falls back to the
//! background removal a single refused release gets (`refused_release.rs`): each key's
//! delete is refused too, so its name is never given back, the session is retired and
//! every key swept until a delete is allowed. Taken again once allowed, the locks come
//! with newer tokens, and only the new keys are left.

use std::time::Duration;

use etcd_client::{Client, Permission};
use fencelock::etcd::EtcdLocker;
use fencelock::{LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, handled, keys, namespace, within};

const NAMES: [&str; 2] = ["x", "y"];

/// Grants the role `permission` on `<ns>/` in place of the one it has.
async fn set_permission(admin: &mut Client, ns: &str, permission: Permission) {
    crate::support::revoke_namespace(admin, ns).await;
    admin
        .role_grant_permission("locker", permission)
        .await
        .expect("grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_falls_back_to_each_keys_removal_and_reuses_no_name() {
    let cluster = etcd().await;
    let ns = namespace("release-all-refused");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let locks = EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
        .await
        .expect("connect");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;

    // A short TTL: the refused keys go with their retired session's lease (whose revoke
    // is refused too) if the sweep does not delete them first.
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let first = locks.lock_all(&NAMES, &options).await.expect("lock_all");
    let first_token = first.token();
    let held: Vec<String> = first.guards().iter().map(|g| g.key().to_owned()).collect();

    // The release's one transaction is refused, then each key's own removal.
    set_permission(
        &mut admin,
        &ns,
        Permission::read(format!("{ns}/")).with_prefix(),
    )
    .await;
    let deletes = || handled(&cluster, "DeleteRange");
    let before = deletes().await;
    let refused = first.release().await.expect_err("refused");
    assert!(refused.is_permission_denied(), "{refused}");
    within(
        Duration::from_secs(10),
        "each key's removal is refused too",
        async {
            while deletes().await < before + 2.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert_eq!(
        keys(&mut admin, &format!("{ns}/")).await,
        held,
        "the refused keys stay"
    );

    // Allowed again: taken again, with newer tokens, never on the refused keys.
    set_permission(
        &mut admin,
        &ns,
        Permission::read_write(format!("{ns}/")).with_prefix(),
    )
    .await;
    let second = within(
        Duration::from_secs(20),
        "granted again",
        locks.lock_all(&NAMES, &options),
    )
    .await
    .expect("lock_all again");
    assert!(second.token() > first_token);
    let renewed: Vec<String> = second.guards().iter().map(|g| g.key().to_owned()).collect();
    assert_eq!(keys(&mut admin, &format!("{ns}/")).await, renewed);
    within(
        Duration::from_secs(1),
        "the old keys were deleted",
        watch.deletions(&held),
    )
    .await;
    crate::support::released(second.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_for_one_lock_deletes_the_others_key_itself() {
    let cluster = etcd().await;
    let ns = namespace("release-all-one-refused");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let locks = EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let both = locks.lock_all(&NAMES, &options).await.expect("lock_all");
    let y = both.guards()[1].key().to_owned();

    // Write stays allowed on x only: the one transaction deleting both is refused whole.
    set_permission(
        &mut admin,
        &ns,
        Permission::read(format!("{ns}/")).with_prefix(),
    )
    .await;
    admin
        .role_grant_permission(
            "locker",
            Permission::read_write(format!("{ns}/x/")).with_prefix(),
        )
        .await
        .expect("grant x");
    let refused = both.release().await.expect_err("y's delete is refused");
    assert!(refused.is_permission_denied(), "{refused}");

    // Answered before the release returned: x's key was deleted by a request of its own
    // (not left to a background removal), y's stays until a delete is allowed.
    assert_eq!(
        keys(&mut admin, &format!("{ns}/x/")).await,
        Vec::<String>::new()
    );
    assert_eq!(keys(&mut admin, &format!("{ns}/y/")).await, vec![y]);
}
