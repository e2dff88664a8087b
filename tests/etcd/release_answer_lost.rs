//! A release whose first attempt was applied but whose answer never arrived is retried,
//! and the retry finds the key gone: that is a successful release, not "not held".

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, TwoPaths, etcd, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_applied_without_an_answer_reports_released() {
    let cluster = etcd().await;
    let ns = namespace("release-answer");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(3)).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let guard = client.lock("x", &options).await.expect("lock");
    let key = guard.key().to_owned();

    // The release reaches etcd and is applied; its answer is kept from the client.
    let mut etcd_client = cluster.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(&ns, "x");
    let mut watch = PrefixWatch::start(&mut etcd_client, &prefix).await;
    paths.a.hold_answers();
    let releasing = tokio::spawn(guard.release());
    within(
        Duration::from_secs(5),
        "the first attempt applied",
        watch.deleted(&key),
    )
    .await;

    // Its connection breaks; the retry goes through b and finds nothing to delete.
    paths.move_to_b();
    let outcome = within(Duration::from_secs(10), "the release", releasing)
        .await
        .expect("task")
        .expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released);
}
