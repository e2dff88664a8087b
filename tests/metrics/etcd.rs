//! etcd: acquisitions by outcome, grants, held locks, hold time, releases, renewals, a
//! loss by revoked lease, and errors by kind.

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::metrics::names;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::recorded::recorded;

const ETCD: (&str, &str) = ("backend", "etcd");

#[tokio::test]
async fn etcd_operations_are_counted() {
    let metrics = recorded();
    let cluster = EtcdCluster::single().await.expect("etcd");
    let a = EtcdLocker::connect(cluster.config("metrics"))
        .await
        .expect("connect");
    let b = EtcdLocker::connect(cluster.config("metrics"))
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(1));

    let held = a.lock("m-etcd", &options).await.expect("lock");
    let lock = ("lock", "m-etcd");
    assert_eq!(metrics.counter(names::GRANTS, &[ETCD, lock]), 1);
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ETCD]), 1.0);
    let acquired = metrics.samples(
        names::ACQUIRE_SECONDS,
        &[ETCD, lock, ("outcome", "acquired")],
    );
    assert_eq!(acquired.len(), 1);

    // Busy, and a wait that times out.
    assert!(b.try_lock("m-etcd", &options).await.expect("try").is_none());
    let waiting = options
        .clone()
        .with_wait_timeout(Duration::from_millis(200));
    let err = b.lock("m-etcd", &waiting).await.expect_err("times out");
    assert!(err.is_wait_timeout());
    assert_eq!(
        metrics
            .samples(names::ACQUIRE_SECONDS, &[ETCD, lock, ("outcome", "busy")])
            .len(),
        1
    );
    let timed_out = metrics.samples(
        names::ACQUIRE_SECONDS,
        &[ETCD, lock, ("outcome", "timeout")],
    );
    assert_eq!(timed_out.len(), 1);
    assert!(timed_out[0] >= 0.2, "waited {} s", timed_out[0]);

    // Renewals: the session's keep-alives, every TTL/3.
    let renewed = metrics
        .counter_reaches(
            names::RENEWALS,
            &[ETCD, ("outcome", "ok")],
            1,
            Duration::from_secs(3),
        )
        .await;
    assert!(renewed >= 1, "no renewal counted");

    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        metrics.counter(names::RELEASES, &[ETCD, ("outcome", "released")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ETCD]), 0.0);
    assert_eq!(metrics.samples(names::HOLD_SECONDS, &[ETCD]).len(), 1);

    // A loss: the lease revoked behind the holder's back.
    let held = a.lock("m-etcd-lost", &options).await.expect("lock");
    let mut admin = cluster.client().await.expect("admin client");
    admin.lease_revoke(held.lease_id()).await.expect("revoke");
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("loss reported");
    assert_eq!(reason, LossReason::Revoked);
    assert_eq!(
        metrics.counter(names::LOSSES, &[ETCD, ("reason", "revoked")]),
        1
    );
    drop(held);
    assert_eq!(
        metrics.counter(names::RELEASES, &[ETCD, ("outcome", "dropped")]),
        1
    );
    assert_eq!(metrics.gauge(names::LOCKS_HELD, &[ETCD]), 0.0);

    // An error, by kind.
    let err = a.lock("", &options).await.expect_err("empty name");
    assert!(err.is_invalid_input());
    assert_eq!(
        metrics.counter(
            names::ERRORS,
            &[ETCD, ("operation", "acquire"), ("kind", "invalid_input")]
        ),
        1
    );
    a.close().await.expect("close");
    b.close().await.expect("close");
}
