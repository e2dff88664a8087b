//! A `lock_all`'s release whose answer is lost: its one transaction was applied (every
//! key deleted at one revision) but the client never heard, and the retry finds nothing to
//! delete. As for a single release (`release_answer_lost.rs`): `Unconfirmed`, since
//! nothing told the guards they were lost before; every name is spent (the attempt
//! without an answer is a request about every key), so the session's next acquisition of
//! those names takes new ones; no key is left.

use std::time::Duration;

use fencelock::{LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, TwoPaths, etcd, keys, namespace, released, within};

const NAMES: [&str; 3] = ["x", "y", "z"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_applied_without_an_answer_is_unconfirmed_and_spends_every_name() {
    let cluster = etcd().await;
    let ns = namespace("release-all-answer");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(3)).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let all = client.lock_all(&NAMES, &options).await.expect("lock_all");
    let held: Vec<String> = all.guards().iter().map(|g| g.key().to_owned()).collect();
    let lease = all.guards()[0].lease_id();
    let mut admin = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;

    // The release reaches etcd and is applied; its answer is kept from the client.
    paths.a.hold_answers();
    let releasing = tokio::spawn(all.release());
    let revisions = within(
        Duration::from_secs(5),
        "the release applied",
        watch.deletions(&held),
    )
    .await;
    assert!(
        revisions.iter().all(|r| *r == revisions[0]),
        "one transaction deletes every key at one revision: {revisions:?}"
    );

    // Its connection breaks; the retry goes through b and finds nothing to delete.
    paths.move_to_b();
    let outcome = within(Duration::from_secs(10), "the release", releasing)
        .await
        .expect("task")
        .expect("release");
    assert_eq!(outcome, ReleaseOutcome::Unconfirmed);
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());

    // Every name was spent: the same session takes new ones for the same locks.
    let again = client.lock_all(&NAMES, &options).await.expect("again");
    assert_eq!(again.guards()[0].lease_id(), lease, "the same session");
    for (guard, old) in again.guards().iter().zip(&held) {
        assert_ne!(
            guard.key(),
            old,
            "a name whose delete got no answer is reused"
        );
    }
    released(again.release().await);
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}
