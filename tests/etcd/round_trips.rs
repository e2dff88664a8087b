//! An uncontended lock + release costs exactly two write RPCs, counted by etcd itself: the
//! acquire transaction and the release's delete of exactly its key (safe as a plain
//! delete: key names are reused only once every request about the previous key was
//! answered, `key_life.rs`).

use std::time::Duration;

use fencelock::testkit::metric_sum;
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{etcd, locker, namespace};

const HANDLED: &str = "grpc_server_handled_total";

async fn kv_calls(cluster: &fencelock::testkit::EtcdCluster, method: &str) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    let method = format!("grpc_method=\"{method}\"");
    metric_sum(
        &metrics,
        HANDLED,
        &[&method, "grpc_service=\"etcdserverpb.KV\""],
    )
}

async fn all_kv_calls(cluster: &fencelock::testkit::EtcdCluster) -> f64 {
    let metrics = cluster.metrics(0).await.expect("metrics");
    metric_sum(&metrics, HANDLED, &["grpc_service=\"etcdserverpb.KV\""])
}

#[tokio::test]
async fn uncontended_lock_and_release_are_two_requests() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("round-trips")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    // The session's lease is granted once per client, not per lock: open it first.
    locks.session(options.ttl()).await.expect("session");

    let txns_before = kv_calls(&cluster, "Txn").await;
    let deletes_before = kv_calls(&cluster, "DeleteRange").await;
    let all_before = all_kv_calls(&cluster).await;
    let guard = locks.lock("hot", &options).await.expect("lock");
    assert!(guard.is_held());
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let txns = kv_calls(&cluster, "Txn").await - txns_before;
    let deletes = kv_calls(&cluster, "DeleteRange").await - deletes_before;
    let all = all_kv_calls(&cluster).await - all_before;

    assert_eq!(txns, 1.0, "one transaction to acquire");
    assert_eq!(deletes, 1.0, "one delete of exactly our key to release");
    assert_eq!(all, 2.0, "no other KV call (range, put)");
}
