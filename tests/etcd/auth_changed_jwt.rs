//! With JWT auth tokens (`--auth-token=jwt`), a token carries the auth store's revision it
//! was issued at, and etcd refuses it as "revision of auth store is old" after any change
//! of users or roles anywhere in the cluster (`auth/store.go` `isOpPermitted`), until the
//! client authenticates again. The change need not concern the lock's user at all: an
//! operator adding someone else must not stop every lock of every client (until the JWT's
//! TTL, 5 minutes by default, ran out), nor leave a holder unable to release.

use std::time::Duration;

use etcd_client::TxnOp;
use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, namespace, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_taken_waited_for_and_released_after_an_unrelated_auth_change() {
    let cluster = EtcdCluster::builder()
        .jwt_tokens()
        .start()
        .await
        .expect("etcd");
    let ns = namespace("auth-changed-jwt");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let worker = || async {
        EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
            .await
            .expect("connect")
    };
    let holder = worker().await;
    let waiter = worker().await;
    // A plain client, authenticated before the change: it shows the change made every
    // earlier token old.
    let mut probe = cluster.client_as("worker", "pw").await.expect("probe");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/x/")).await;
    let held = holder.lock("x", &LockOptions::new()).await.expect("lock x");
    watch.next_put().await;

    // The fault: an operator adds a user who has nothing to do with the locks.
    admin
        .user_add("someone-else", "pw2", None)
        .await
        .expect("user added");
    let old = probe
        .get(format!("{ns}/x/"), None)
        .await
        .expect_err("the probe's token is old");
    assert!(old.to_string().contains("auth store is old"), "{old}");

    // A new acquisition (its join) and a wait (its watch) after the change.
    let mut waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let guard = waiter.lock("x", &LockOptions::new()).await?;
            let token = guard.token();
            guard.release().await.map(|outcome| (token, outcome))
        })
    };
    within(Duration::from_secs(10), "the waiter queued", async {
        tokio::select! {
            _ = watch.next_put() => {}
            ended = &mut waiting => panic!("the wait ended before it queued: {ended:?}"),
        }
    })
    .await;
    // A release by a holder that took its lock before the change.
    released(within(Duration::from_secs(10), "x released", held.release()).await);
    let (token, outcome) = within(Duration::from_secs(10), "the waiter granted", waiting)
        .await
        .expect("task")
        .expect("granted and released");
    released(Ok(outcome));
    assert!(token.get() > 0);

    // Another change; a client that did nothing since takes a new lock and writes
    // through it (a guarded write, sent once unless refused unapplied).
    admin.role_add("another-role").await.expect("role added");
    let y = holder.lock("y", &LockOptions::new()).await.expect("lock y");
    let data = format!("{ns}/data");
    y.txn_if_held(vec![TxnOp::put(data.as_str(), "v", None)])
        .await
        .expect("guarded write");
    // The test's own client (etcd-client's) must authenticate again by hand.
    admin
        .refresh_token()
        .await
        .expect("admin authenticates again");
    let read = admin.get(data.as_str(), None).await.expect("read");
    assert_eq!(read.kvs().first().map(|kv| kv.value()), Some(&b"v"[..]));
    released(y.release().await);
}
