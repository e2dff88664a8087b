//! The token is the node's czxid, and why: when the lock's parent node is deleted and
//! created again, the sequence numbers start over, the czxid does not.

use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{admin, locker, namespace, shared};

fn sequence(path: &str) -> u64 {
    let (_, digits) = path.rsplit_once("-lock-").expect("a lock node");
    digits.parse().expect("a sequence number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_survives_the_parent_being_recreated_the_sequence_does_not() {
    let cluster = shared();
    let ns = namespace("czxid");
    let locks = locker(cluster, &ns).await;
    let admin = admin(cluster).await;
    let options = LockOptions::new();

    let mut last = None;
    for _ in 0..3 {
        let guard = locks.lock("orders", &options).await.expect("lock");
        let stat = admin
            .check_stat(guard.path())
            .await
            .expect("stat")
            .expect("the holder's node exists");
        assert_eq!(
            guard.token().get(),
            u64::try_from(stat.czxid).expect("positive"),
            "the token is the node's czxid"
        );
        last = Some((guard.token(), sequence(guard.path())));
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let (old_token, old_sequence) = last.expect("three grants");
    assert!(old_sequence >= 2, "the parent counted three contenders");

    // The lock's parent is removed (an operator's cleanup; the server does the same to an
    // empty container node) and created again by the next acquisition.
    admin
        .delete(&format!("{ns}/orders"), None)
        .await
        .expect("delete the lock's node");
    let guard = locks.lock("orders", &options).await.expect("lock again");
    let new_sequence = sequence(guard.path());
    assert!(
        new_sequence < old_sequence,
        "the sequence started over ({new_sequence} after {old_sequence}): not a token"
    );
    assert!(
        guard.token() > old_token,
        "the czxid still grows ({} after {old_token})",
        guard.token()
    );
    let _ = guard.release().await;
}
