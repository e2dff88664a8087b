//! A guard whose lease is revoked reports the loss; its late release neither fails
//! ambiguously nor deletes the next holder's key.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, LossReason, ReleaseOutcome};

use crate::support::{etcd, keys, locker, namespace, within};

#[tokio::test]
async fn revoked_guard_reports_lost_and_cannot_release_the_next_holder() {
    let cluster = etcd().await;
    let ns = namespace("revoked");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));

    let stale = a.lock("ledger", &options).await.expect("lock");
    assert!(stale.is_held());
    client.lease_revoke(stale.lease_id()).await.expect("revoke");

    let reason = within(Duration::from_secs(3), "loss reported", stale.lost()).await;
    assert_eq!(reason, LossReason::Revoked);
    assert!(!stale.is_held());

    let next = b.lock("ledger", &options).await.expect("lock");
    assert!(next.token() > stale.token());
    assert_eq!(
        stale.release().await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        keys(&mut client, &format!("{ns}/ledger/")).await,
        vec![next.key().to_owned()]
    );

    // The client that lost its session opens a new one for its next lock.
    crate::support::released(next.release().await);
    let again = a
        .lock("ledger", &options)
        .await
        .expect("lock with a new session");
    assert!(again.is_held());
    crate::support::released(again.release().await);
}
