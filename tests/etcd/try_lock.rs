//! try_lock returns at once: `None` while the lock is taken, leaving nothing behind.

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, keys, locker, namespace};

#[tokio::test]
async fn try_lock_takes_a_free_lock_and_refuses_a_taken_one() {
    let cluster = etcd().await;
    let ns = namespace("try");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let options = LockOptions::new();

    let held = a
        .try_lock("printer", &options)
        .await
        .expect("try_lock")
        .expect("free");
    assert!(
        b.try_lock("printer", &options)
            .await
            .expect("try_lock")
            .is_none()
    );
    // The refused attempt removed its queue key before answering.
    assert_eq!(
        keys(&mut client, &format!("{ns}/printer/")).await,
        vec![held.key().to_owned()]
    );

    let first = held.token();
    crate::support::released(held.release().await);
    let next = b
        .try_lock("printer", &options)
        .await
        .expect("try_lock")
        .expect("free now");
    assert!(next.token() > first);
    crate::support::released(next.release().await);
}
