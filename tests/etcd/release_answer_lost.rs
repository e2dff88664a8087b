//! A release whose first attempt got no answer is retried; when the retry finds the key
//! gone, the release cannot know whether its own first attempt deleted it or someone else
//! did first (and another client held the lock since): it says so (`Unconfirmed`),
//! neither "released" nor "not held".

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, TwoPaths, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_applied_without_an_answer_is_unconfirmed_not_not_held() {
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
    assert_eq!(outcome, ReleaseOutcome::Unconfirmed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_by_someone_else_before_the_release_landed_is_not_reported_released() {
    let cluster = etcd().await;
    let ns = namespace("release-answer-other");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(3)).await;
    let other = locker(&cluster, &ns).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let guard = client.lock("x", &options).await.expect("lock");
    let key = guard.key().to_owned();
    let mut admin = cluster.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(&ns, "x");
    let mut watch = PrefixWatch::start(&mut admin, &prefix).await;

    // The release's first attempt is kept on its way (and the connection breaks); before
    // it could land, an operator deletes the key and another client takes the lock.
    paths.hold_next_request_on_a();
    let releasing = tokio::spawn(guard.release());
    within(
        Duration::from_secs(5),
        "the release's attempt kept",
        paths.a.requests_held(1),
    )
    .await;
    admin
        .delete(key.as_str(), None)
        .await
        .expect("operator delete");
    watch.deleted(&key).await;
    let taken = other.lock("x", &options).await.expect("another client");
    crate::support::released(taken.release().await);

    // The retry (through b) finds nothing to delete: the lock was not this release's to
    // free at the end, and it must not say it was.
    paths.b.heal();
    let outcome = within(Duration::from_secs(10), "the release", releasing)
        .await
        .expect("task")
        .expect("release");
    assert_ne!(outcome, ReleaseOutcome::Released);
    assert_eq!(outcome, ReleaseOutcome::Unconfirmed);
}
