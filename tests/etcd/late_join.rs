//! A join whose outcome the client never learned can be applied later, after the client
//! cleaned up, under a lease the process keeps renewing. Such a key must never block the
//! lock for long, and must never be taken over by a later acquisition as if it were its
//! own: the session that sent the join is retired (its lease, and any late key with it,
//! goes once nothing else uses it), and its key name is never used again.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{TwoPaths, etcd, keys, locker, namespace, within};

/// Runs `call` (an acquisition with a 50 ms wait timeout) while path a keeps the join the
/// client sends and breaks its connection at once (b still refuses, so no retry of the
/// join gets through), and the call is dropped at its wait timeout without an answer.
/// Then path b opens and the client's cleanup goes through; the join is still kept for a
/// late delivery when this returns.
async fn drop_a_join<T>(
    cluster: &fencelock::testkit::EtcdCluster,
    paths: &TwoPaths,
    call: impl std::future::Future<Output = Result<T, fencelock::LockError>>,
) {
    paths.hold_next_request_on_a();
    let outcome = within(Duration::from_secs(5), "the call ends", call).await;
    assert_eq!(paths.a.held_requests(), 1, "the join is kept");
    match outcome {
        Err(err) => assert!(err.is_wait_timeout(), "{err}"),
        Ok(_) => panic!("the join got through"),
    }
    // The cleanup's delete goes through b, handled before the join is delivered.
    let before = crate::support::handled(cluster, "DeleteRange").await;
    paths.b.heal();
    within(Duration::from_secs(10), "the cleanup's delete", async {
        while crate::support::handled(cluster, "DeleteRange").await <= before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A client that reaches its member over two paths (the fault's), another client, an
/// etcd client to look at the keys, and 30 s locks.
struct Fixture {
    cluster: fencelock::testkit::EtcdCluster,
    prefix: String,
    paths: TwoPaths,
    client: fencelock::etcd::EtcdLocker,
    other: fencelock::etcd::EtcdLocker,
    etcd_client: etcd_client::Client,
    options: LockOptions,
}

impl Fixture {
    async fn start(test: &str) -> Self {
        let cluster = etcd().await;
        let ns = namespace(test);
        let paths = TwoPaths::start(&cluster).await;
        let client = paths.locker(&ns, Duration::from_secs(1)).await;
        let other = locker(&cluster, &ns).await;
        let etcd_client = cluster.client().await.expect("client");
        Self {
            prefix: format!("{ns}/x/"),
            cluster,
            paths,
            client,
            other,
            etcd_client,
            options: LockOptions::new().with_ttl(Duration::from_secs(30)),
        }
    }

    /// Another client gets "x" within 5 s, and its key is the only one left under "x":
    /// nothing of the late join blocks the lock.
    async fn another_client_gets_x(&mut self, what: &str) -> fencelock::etcd::EtcdGuard {
        let wait = self
            .options
            .clone()
            .with_wait_timeout(Duration::from_secs(5));
        let granted = self.other.lock("x", &wait).await;
        let left = keys(&mut self.etcd_client, &self.prefix).await;
        let granted =
            granted.unwrap_or_else(|err| panic!("{what} blocks the lock ({err}); keys: {left:?}"));
        assert_eq!(left, vec![granted.key().to_owned()]);
        granted
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_applied_after_its_call_was_dropped_does_not_block_the_lock() {
    let mut f = Fixture::start("late-join").await;
    // The session exists before the fault: only the join is kept.
    f.client.session(f.options.ttl()).await.expect("session");

    let short = f
        .options
        .clone()
        .with_wait_timeout(Duration::from_millis(50));
    drop_a_join(&f.cluster, &f.paths, f.client.lock("x", &short)).await;

    // The join reaches etcd now, after the client's cleanup.
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;

    // Within a few seconds nothing is left of it, and another client gets the lock.
    let granted = f.another_client_gets_x("the late join's key").await;
    crate::support::released(granted.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reader_key_is_never_taken_over_by_a_writer() {
    let f = Fixture::start("late-reader").await;
    let options = f.options.clone();
    f.client.session(options.ttl()).await.expect("session");
    let rw = f.client.rwlock("x").expect("rwlock");

    let short = options.clone().with_wait_timeout(Duration::from_millis(50));
    drop_a_join(&f.cluster, &f.paths, rw.read(&short)).await;
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;

    // The same client now writes: it must wait its turn behind the late reader key (until
    // that key's session is gone), never hold the write lock *as* that reader key.
    let wait = options.clone().with_wait_timeout(Duration::from_secs(10));
    let writing = within(Duration::from_secs(15), "the write lock", rw.write(&wait))
        .await
        .expect("write lock");
    let readers = f.other.rwlock("x").expect("rwlock");
    let beside = readers.try_read(&options).await.expect("try_read");
    assert!(
        beside.is_none(),
        "a reader was admitted beside the writer (the writer holds a reader's key)"
    );
    crate::support::released(writing.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_join_is_swept_away_while_its_session_still_holds_other_locks() {
    let mut f = Fixture::start("late-join-held").await;
    // The session holds another lock for the whole test: retiring it cannot revoke its
    // lease (and the late key with it) until that lock goes.
    let elsewhere = f.client.lock("elsewhere", &f.options).await.expect("lock");

    let short = f
        .options
        .clone()
        .with_wait_timeout(Duration::from_millis(50));
    drop_a_join(&f.cluster, &f.paths, f.client.lock("x", &short)).await;
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;

    let granted = f.another_client_gets_x("the late join's key").await;
    assert!(elsewhere.is_held(), "the session's other lock is untouched");
    crate::support::released(granted.release().await);
    crate::support::released(elsewhere.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_join_of_a_lock_granted_on_a_retry_and_released_is_swept_away() {
    let mut f = Fixture::start("late-join-granted").await;
    // The session holds another lock for the whole test, so its lease lives on.
    let elsewhere = f.client.lock("elsewhere", &f.options).await.expect("lock");

    // The first attempt of the join is kept on a (the connection through a breaks); the
    // retry is granted. b opens only once a holds the first attempt: opened before, the
    // client could send that attempt through b (it balances over both paths once b
    // accepts), which CI met once under load.
    f.paths.hold_next_request_on_a();
    let (granted, ()) = tokio::join!(
        within(
            Duration::from_secs(10),
            "the retried join",
            f.client.lock("x", &f.options),
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

    // The first attempt lands now, after the release, under the live lease.
    crate::support::deliver_late(&f.cluster, &f.paths.a).await;

    let next = f.another_client_gets_x("the late first join's key").await;
    assert!(elsewhere.is_held(), "the session's other lock is untouched");
    crate::support::released(next.release().await);
    crate::support::released(elsewhere.release().await);
}
