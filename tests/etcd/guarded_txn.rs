//! Owner-guarded etcd writes apply only while the guard owns the lock.

use std::time::Duration;

use fencelock::{LockBackend, LockError, LockOptions};

use crate::support::{etcd, locker, namespace, within};

#[tokio::test]
async fn guarded_writes_stop_applying_once_the_lock_is_lost() {
    let cluster = etcd().await;
    let ns = namespace("guarded");
    let locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let data = format!("{ns}-data/balance");
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));

    let guard = locks.lock("account", &options).await.expect("lock");
    guard
        .put_if_held(data.as_str(), "100")
        .await
        .expect("guarded put");

    client.lease_revoke(guard.lease_id()).await.expect("revoke");
    // No waiting for the loss to be noticed: the guard is in the transaction's condition.
    let err = guard
        .put_if_held(data.as_str(), "0")
        .await
        .expect_err("not the owner");
    assert!(matches!(err, LockError::NotHeld { .. }), "{err}");
    let stored = client.get(data.as_str(), None).await.expect("get");
    assert_eq!(stored.kvs()[0].value(), b"100");
    within(
        Duration::from_secs(3),
        "loss",
        fencelock::LockGuard::lost(&guard),
    )
    .await;
}
