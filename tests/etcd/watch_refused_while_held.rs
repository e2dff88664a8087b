//! Read permission on held locks' keys is taken away. Their watches are refused from then
//! on with "permission denied", which etcd 3.4 and 3.5 also answer for a stream's stale
//! auth token, and each is asked for again every 250 ms while its lock is held. The
//! client must not take these refusals for a stale token and reopen its stream for them:
//! each reopen asks for every watch of the client again from a past revision, which etcd
//! catches up a few hundred per 100 ms, and the other locks' deletions would come seconds
//! late for as long as the locks are held. Before the fix the stream was reopened about
//! once a second: 4 streams over 3 s after the break, where the break's is the only one.

use std::time::Duration;

use etcd_client::Permission;
use fencelock::testkit::{EtcdCluster, FaultProxy, metric_sum};
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};

use crate::support::{address, etcd, namespace, within};

/// Watch streams etcd has started (each stream a client opens).
async fn streams_started(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    metric_sum(
        &metrics,
        "grpc_server_started_total",
        &["grpc_method=\"Watch\""],
    )
}

/// Requests etcd has read on watch streams (creations and cancels).
async fn watch_requests(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    metric_sum(
        &metrics,
        "grpc_server_msg_received_total",
        &["grpc_method=\"Watch\""],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_locks_whose_watches_are_refused_do_not_reopen_the_stream() {
    let cluster = etcd().await;
    let ns = namespace("refused-held");
    let mut admin = crate::support::with_locker_user(&cluster, &ns, "holder").await;
    // Lock b's keys stay readable when the namespace's permission is taken away.
    admin
        .role_grant_permission(
            "locker",
            Permission::read_write(format!("{ns}/b/")).with_prefix(),
        )
        .await
        .expect("grant b");
    let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
        .await
        .expect("proxy");
    let locks = crate::support::locker_as_through(&proxy, &ns, "holder").await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(60));
    let mut refused = Vec::new();
    for name in ["a1", "a2", "a3"] {
        refused.push(locks.lock(name, &options).await.expect("lock"));
    }
    let b = locks.lock("b", &options).await.expect("lock b");
    // The watches are asked for once their grants have held 100 ms.
    crate::support::until_at_least("every lock watched", 4.0, || {
        crate::support::watchers(&cluster)
    })
    .await;

    crate::support::revoke_namespace(&mut admin, &ns).await;
    // The stream breaks: every watch is asked for again on a new one, and a1's, a2's and
    // a3's are refused (etcd checks permission when a watch is created).
    let before = streams_started(&cluster).await;
    proxy.sever();
    proxy.heal();
    within(Duration::from_secs(10), "the stream reopened", async {
        while streams_started(&cluster).await < before + 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Absence over a while, during which the refused watches are asked for again.
    let requests = watch_requests(&cluster).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let retried = watch_requests(&cluster).await - requests;
    assert!(retried >= 8.0, "refused watches asked for again: {retried}");
    let reopened = streams_started(&cluster).await - before;
    assert_eq!(reopened, 1.0, "watch streams opened after the break");
    assert!(refused.iter().all(LockGuard::is_held));
    // Lock b is still followed.
    admin.delete(b.key(), None).await.expect("delete b's key");
    let reason = within(Duration::from_secs(5), "b learns its key is gone", b.lost()).await;
    assert_eq!(reason, LossReason::KeyDeleted);
}
