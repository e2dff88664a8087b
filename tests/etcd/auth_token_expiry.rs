//! With auth on, etcd's simple tokens expire after `--auth-token-ttl` without use. A
//! holder quiet for longer (its lease is renewed on a stream, which uses no token) must
//! still release, and a waiter quiet as long must still be granted and release: the
//! client authenticates again instead of reporting "invalid auth token", which would
//! leave the holder's key blocking the lock for as long as its process lives.

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, namespace, within};

/// etcd's token TTL here (the flag takes whole seconds).
const TOKEN_TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_quiet_past_the_token_ttl_releases_and_the_waiter_is_granted() {
    let cluster = EtcdCluster::builder()
        .auth_token_ttl(TOKEN_TTL)
        .start()
        .await
        .expect("etcd");
    let ns = namespace("auth-token-expiry");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let worker = || async {
        EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
            .await
            .expect("connect")
    };
    let holder = worker().await;
    let waiter = worker().await;
    // A plain client without refresh: it shows that the tokens really expired.
    let mut probe = cluster.client_as("worker", "pw").await.expect("probe");
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/x/")).await;

    let held = holder.lock("x", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock("x", &LockOptions::new()).await?;
        let token = guard.token();
        guard.release().await.map(|outcome| (token, outcome))
    });
    watch.next_put().await;

    // Nobody makes a request for more than the token TTL (the fault: time passing).
    tokio::time::sleep(TOKEN_TTL * 2 + Duration::from_millis(500)).await;
    let expired = probe
        .get(format!("{ns}/x/"), None)
        .await
        .expect_err("the probe's token expired");
    assert!(
        expired.to_string().contains("invalid auth token"),
        "{expired}"
    );

    let released = within(
        Duration::from_secs(10),
        "the holder releases",
        held.release(),
    )
    .await
    .expect("released");
    assert_eq!(released, ReleaseOutcome::Released);
    let (token, outcome) = within(Duration::from_secs(10), "the waiter is granted", waiting)
        .await
        .expect("task")
        .expect("granted and released");
    assert_eq!(outcome, ReleaseOutcome::Released);
    assert!(token.get() > 0);
}

/// etcd checks the watch stream's own token, given when the stream opened, on every watch
/// created on it, and refuses a stale one as "permission denied" (not as an invalid
/// token, which the client would refresh). A client whose unary calls refreshed their
/// token after the stream's had expired must still be able to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_after_the_token_expired_on_an_open_watch_stream_is_served() {
    let cluster = EtcdCluster::builder()
        .auth_token_ttl(TOKEN_TTL)
        .start()
        .await
        .expect("etcd");
    let ns = namespace("auth-token-expiry-watch");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "worker").await;
    let worker = || async {
        EtcdLocker::connect(cluster.config(&ns).with_credentials("worker", "pw"))
            .await
            .expect("connect")
    };
    let client = worker().await;
    let other = worker().await;
    let mut watch = PrefixWatch::start(&mut admin, &format!("{ns}/")).await;

    // The client's watch stream opens (a wait on x), and stays open: it holds w.
    let kept = client.lock("w", &LockOptions::new()).await.expect("w");
    watch.next_put().await;
    let x = other.lock("x", &LockOptions::new()).await.expect("x");
    watch.next_put().await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("x", &LockOptions::new()).await })
    };
    watch.next_put().await;
    crate::support::released(x.release().await);
    let granted = within(Duration::from_secs(10), "x granted", waiting)
        .await
        .expect("task")
        .expect("granted");
    crate::support::released(granted.release().await);

    // Every token expires; a unary call refreshes the client's, not the stream's.
    tokio::time::sleep(TOKEN_TTL * 2 + Duration::from_millis(500)).await;
    let z = client
        .try_lock("z", &LockOptions::new())
        .await
        .expect("try z")
        .expect("z free");
    crate::support::released(z.release().await);

    // A new wait creates its watch on the open stream.
    let y = other.lock("y", &LockOptions::new()).await.expect("y");
    let creates = || async {
        let metrics = cluster.metrics(0).await.expect("metrics");
        fencelock::testkit::metric_sum(
            &metrics,
            "grpc_server_msg_received_total",
            &["grpc_method=\"Watch\""],
        )
    };
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.lock("y", &LockOptions::new()).await })
    };
    loop {
        let (put, key) = watch.next().await;
        if put && key.starts_with(&format!("{ns}/y/")) && key != y.key() {
            break;
        }
    }
    // Served by a watch: once it is set up (half a second), a quiet wait sends nothing
    // on the watch stream, where refused creates asked again every 250 ms would.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = creates().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = creates().await - before;
    assert!(sent < 1.0, "{sent} watch requests in 1 s of waiting");
    crate::support::released(y.release().await);
    let granted = within(Duration::from_secs(10), "y granted", waiting)
        .await
        .expect("task")
        .expect("the wait is served");
    crate::support::released(granted.release().await);
    crate::support::released(kept.release().await);
}
