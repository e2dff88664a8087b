//! The one-transaction `lock_all` when its join gets no answer: the join may have been
//! applied, or may be applied later, for every key it carries. No key of it may be left
//! to block a lock, and no key may be taken for a later acquisition's own (a second
//! grant). The rules are `key_life.rs`'s, for every key of the transaction.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, TwoPaths, etcd, keys, locker, namespace, within};

const NAMES: [&str; 2] = ["x", "y"];

/// A client over two paths (1 s request timeout), another client, and an etcd client.
struct Fixture {
    cluster: fencelock::testkit::EtcdCluster,
    ns: String,
    paths: TwoPaths,
    client: fencelock::etcd::EtcdLocker,
    other: fencelock::etcd::EtcdLocker,
    admin: etcd_client::Client,
    options: LockOptions,
}

impl Fixture {
    async fn start(test: &str) -> Self {
        let cluster = etcd().await;
        let ns = namespace(test);
        let paths = TwoPaths::start(&cluster).await;
        let client = paths.locker(&ns, Duration::from_secs(1)).await;
        let other = locker(&cluster, &ns).await;
        let admin = cluster.client().await.expect("client");
        Self {
            cluster,
            ns,
            paths,
            client,
            other,
            admin,
            options: LockOptions::new().with_ttl(Duration::from_secs(30)),
        }
    }

    /// The keys under x and y.
    async fn lock_keys(&mut self) -> Vec<String> {
        let mut found = keys(&mut self.admin, &format!("{}/x/", self.ns)).await;
        found.extend(keys(&mut self.admin, &format!("{}/y/", self.ns)).await);
        found
    }

    /// Another client takes x and y together within 5 s, and its keys are the only ones
    /// left under them: nothing of the unanswered join blocks them or stands in for them.
    async fn another_client_gets_both(&mut self, what: &str) {
        let wait = self
            .options
            .clone()
            .with_wait_timeout(Duration::from_secs(5));
        let granted = self.other.lock_all(&NAMES, &wait).await;
        let left = self.lock_keys().await;
        let granted =
            granted.unwrap_or_else(|err| panic!("{what} blocks the locks ({err}); keys: {left:?}"));
        let mine: Vec<String> = granted
            .guards()
            .iter()
            .map(|g| g.key().to_owned())
            .collect();
        assert_eq!(left, mine);
        crate::support::released(granted.release().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_applied_without_an_answer_fails_retryably_and_leaves_no_key() {
    let mut f = Fixture::start("lock-all-answer-lost").await;
    let elsewhere = f.client.lock("elsewhere", &f.options).await.expect("lock");
    let mut watch = PrefixWatch::start(&mut f.admin.clone(), &format!("{}/x/", f.ns)).await;

    // The join reaches etcd and is applied; its answer is kept from the client. Its
    // connection then breaks, and the retry (through b) finds the keys already there.
    f.paths.a.hold_answers();
    let taking = {
        let (client, options) = (f.client.clone(), f.options.clone());
        tokio::spawn(async move { client.lock_all(&NAMES, &options).await.map(drop) })
    };
    within(Duration::from_secs(5), "the join applied", watch.next_put()).await;
    f.paths.move_to_b();
    let err = within(Duration::from_secs(10), "the lock_all", taking)
        .await
        .expect("task")
        .expect_err("a join whose keys it cannot prove its own is not granted");
    assert!(err.is_unavailable(), "retryable: {err}");

    // Its keys are removed (before the answer, or soon after): nothing blocks x and y.
    f.another_client_gets_both("the unanswered join's keys")
        .await;
    // A retry on the same locker gets both (on a new session: the old one is retired).
    let again = within(
        Duration::from_secs(10),
        "the retry",
        f.client.lock_all(&NAMES, &f.options),
    )
    .await
    .expect("the retry is granted");
    assert_ne!(again.guards()[0].lease_id(), elsewhere.lease_id());
    crate::support::released(again.release().await);
    assert!(
        elsewhere.is_held(),
        "the retired session's other lock stays"
    );
    crate::support::released(elsewhere.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_attempt_after_a_retry_was_granted_and_released_is_swept_away() {
    let mut f = Fixture::start("lock-all-late-first").await;
    // The session holds another lock for the whole test, so its lease lives on.
    let elsewhere = f.client.lock("elsewhere", &f.options).await.expect("lock");

    // The join's first attempt is kept on a (its connection breaks); the retry through
    // b is granted. b opens only once a holds the first attempt (see late_join.rs).
    f.paths.hold_next_request_on_a();
    let (granted, ()) = tokio::join!(
        within(
            Duration::from_secs(10),
            "the retried join",
            f.client.lock_all(&NAMES, &f.options),
        ),
        async {
            within(
                Duration::from_secs(10),
                "a holds the first attempt",
                f.paths.a.requests_held(1),
            )
            .await;
            f.paths.b.heal();
        }
    );
    let granted = granted.expect("granted on the retry");
    assert_eq!(f.paths.a.held_requests(), 1, "the first attempt is kept");
    crate::support::released(granted.release().await);

    // The first attempt lands now, after the release, under the live lease: both keys
    // appear again, are never anyone's grant, and are swept.
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;
    f.another_client_gets_both("the late first attempt's keys")
        .await;
    assert!(elsewhere.is_held(), "the session's other lock is untouched");
    crate::support::released(elsewhere.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_dropped_mid_join_leaves_no_key_even_if_the_join_lands_late() {
    let mut f = Fixture::start("lock-all-dropped-join").await;
    let elsewhere = f.client.lock("elsewhere", &f.options).await.expect("lock");

    // The join is kept on a and its connection broken (b refuses: no retry gets
    // through); the call is dropped at its 50 ms wait timeout, without an answer.
    f.paths.hold_next_request_on_a();
    let short = f
        .options
        .clone()
        .with_wait_timeout(Duration::from_millis(50));
    let outcome = within(
        Duration::from_secs(5),
        "the call ends",
        f.client.lock_all(&NAMES, &short),
    )
    .await;
    assert_eq!(f.paths.a.held_requests(), 1, "the join is kept");
    let err = outcome.map(drop).expect_err("the join got through");
    assert!(err.is_wait_timeout(), "{err}");

    // The cleanup's deletes go through b, before the join is delivered, which then puts
    // both keys under the live lease: they are swept.
    let before = crate::support::handled(&f.cluster, "DeleteRange").await;
    f.paths.b.heal();
    within(Duration::from_secs(10), "the cleanup's deletes", async {
        while crate::support::handled(&f.cluster, "DeleteRange").await < before + 2.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;
    f.another_client_gets_both("the late join's keys").await;
    assert!(elsewhere.is_held());
    crate::support::released(elsewhere.release().await);
}
