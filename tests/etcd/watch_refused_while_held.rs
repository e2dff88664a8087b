//! Read permission on a held lock's keys is taken away. Its watch is refused from then on
//! with "permission denied", which some etcd versions also answer for a stale auth
//! token, so the client may authenticate again and reopen its stream once for it. But
//! not every time the refused watch is retried (every 250 ms while the lock is held):
//! each reopen asks for every watch of the client again from a past revision, which etcd
//! catches up a few hundred per 100 ms, and the other locks' deletions would come seconds
//! late for as long as the lock is held. Before the fix the stream was reopened about once
//! a second.

use std::time::Duration;

use etcd_client::{Permission, RoleRevokePermissionOptions};
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

/// etcd's watchers (this test's etcd: only this client watches).
async fn watchers(cluster: &EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    metric_sum(&metrics, "etcd_debugging_mvcc_watcher_total", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_whose_watch_is_refused_does_not_reopen_the_stream_again_and_again() {
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
    let locks = fencelock::etcd::EtcdLocker::connect(
        fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace(&ns)
            .with_credentials("holder", "pw"),
    )
    .await
    .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(60));
    let _a = locks.lock("a", &options).await.expect("lock a");
    let b = locks.lock("b", &options).await.expect("lock b");
    // Both watches are asked for once their grants have held 100 ms.
    within(Duration::from_secs(10), "both locks watched", async {
        while watchers(&cluster).await < 2.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    admin
        .role_revoke_permission(
            "locker",
            format!("{ns}/"),
            Some(RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await
        .expect("revoke");
    // The stream breaks: both watches are asked for again, a's is refused, and the
    // client authenticates again and reopens the stream once for that.
    let before = streams_started(&cluster).await;
    proxy.sever();
    proxy.heal();
    within(
        Duration::from_secs(10),
        "the reopen and the one refresh",
        async {
            while streams_started(&cluster).await < before + 2.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    // Absence over a while: a's watch is asked for again every 250 ms meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reopened = streams_started(&cluster).await - before;
    assert_eq!(reopened, 2.0, "watch streams opened after the break");
    // Lock b is still followed.
    admin.delete(b.key(), None).await.expect("delete b's key");
    let reason = within(Duration::from_secs(5), "b learns its key is gone", b.lost()).await;
    assert_eq!(reason, LossReason::KeyDeleted);
}
