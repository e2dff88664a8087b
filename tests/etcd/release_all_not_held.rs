//! An operator deletes one key of a `lock_all` before its release: that lock's `NotHeld`
//! is the whole guard's outcome (worse than `Released`), and the other locks' keys are
//! deleted all the same, in the release's one transaction. Whether the guard heard of
//! the deletion before the release (it knew it lost) or not (the delete found nothing).

use std::time::Duration;

use fencelock::{LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, etcd, handled, keys, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_before_the_release_is_not_held_and_the_others_are_deleted() {
    let cluster = etcd().await;
    let ns = namespace("release-all-not-held");
    let locks = locker(&cluster, &ns).await;
    let mut admin = cluster.client().await.expect("admin");
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    for heard in [true, false] {
        let all = locks
            .lock_all(&["a", "b", "c"], &options)
            .await
            .expect("lock_all");
        let held: Vec<String> = all.guards().iter().map(|g| g.key().to_owned()).collect();
        let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;
        admin
            .delete(held[1].as_str(), None)
            .await
            .expect("operator delete");
        if heard {
            let (name, _) = within(Duration::from_secs(5), "the loss", all.lost_which()).await;
            assert_eq!(name, "b");
        }
        let txns = handled(&cluster, "Txn").await;
        let deletes = handled(&cluster, "DeleteRange").await;
        assert_eq!(
            all.release().await.expect("release"),
            ReleaseOutcome::NotHeld,
            "heard of the loss first: {heard}"
        );
        assert_eq!(
            (
                handled(&cluster, "Txn").await - txns,
                handled(&cluster, "DeleteRange").await - deletes,
            ),
            (1.0, 0.0),
            "one transaction deletes the other keys"
        );
        let revisions = within(
            Duration::from_secs(5),
            "every key gone",
            watch.deletions(&held),
        )
        .await;
        assert_eq!(revisions[0], revisions[2], "a and c in one transaction");
        assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
    }
}
