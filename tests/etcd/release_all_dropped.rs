//! A `lock_all`'s release dropped before its answer: as for a single guard whose release
//! was dropped, each guard's drop removes its key in the background, and every name is
//! spent, since the release's one transaction may still land. It does land, late, after
//! the same client has taken the same locks again (under new names): it deletes nothing
//! of theirs.

use std::time::Duration;

use fencelock::{LockGuard, LockOptions};

use crate::support::{
    PrefixWatch, TwoPaths, deliver_late, etcd, handled, keys, namespace, released, within,
};

const NAMES: [&str; 2] = ["x", "y"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_before_its_answer_leaves_no_key_and_spends_every_name() {
    let cluster = etcd().await;
    let ns = namespace("release-all-dropped");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(3)).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let all = client.lock_all(&NAMES, &options).await.expect("lock_all");
    let held: Vec<String> = all.guards().iter().map(|g| g.key().to_owned()).collect();
    let mut admin = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;

    // The release's request is kept on a and the connection broken (b refuses: no retry
    // gets through); the release is dropped without an answer.
    paths.hold_next_request_on_a();
    let releasing = tokio::spawn(all.release());
    within(
        Duration::from_secs(5),
        "the release's request kept",
        paths.a.requests_held(1),
    )
    .await;
    releasing.abort();
    let _ = releasing.await;
    assert_eq!(keys(&mut admin, &format!("{ns}/")).await, held);

    // The guards' drops remove the keys in the background, through b once it opens.
    paths.b.heal();
    within(
        Duration::from_secs(10),
        "the keys removed",
        watch.deletions(&held),
    )
    .await;

    // The same locks again on the same session: new names, the old ones spent.
    let again = client.lock_all(&NAMES, &options).await.expect("again");
    let renamed: Vec<String> = again.guards().iter().map(|g| g.key().to_owned()).collect();
    for (new, old) in renamed.iter().zip(&held) {
        assert_ne!(new, old, "a name whose delete may still land is reused");
    }

    // The kept request lands now: the release's one transaction, deleting nothing.
    let txns = handled(&cluster, "Txn").await;
    let deletes = handled(&cluster, "DeleteRange").await;
    deliver_late(&cluster, &paths.a).await;
    assert_eq!(
        (
            handled(&cluster, "Txn").await - txns,
            handled(&cluster, "DeleteRange").await - deletes,
        ),
        (1.0, 0.0),
        "the late request is the release's one transaction"
    );
    assert_eq!(keys(&mut admin, &format!("{ns}/")).await, renamed);
    assert!(again.is_held());
    released(again.release().await);
    assert!(keys(&mut admin, &format!("{ns}/")).await.is_empty());
}
