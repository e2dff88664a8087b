//! A wait that times out, and an acquire whose future is dropped, leave no key behind.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, keys, locker, namespace, within};

#[tokio::test]
async fn a_timed_out_wait_leaves_no_key() {
    let cluster = etcd().await;
    let ns = namespace("wait-timeout");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");

    let held = a.lock("door", &LockOptions::new()).await.expect("lock");
    let options = LockOptions::new().with_wait_timeout(Duration::from_millis(300));
    let err = b.lock("door", &options).await.expect_err("must time out");
    assert!(err.is_wait_timeout(), "{err}");
    // The key is removed before the error is returned.
    assert_eq!(
        keys(&mut client, &format!("{ns}/door/")).await,
        vec![held.key().to_owned()]
    );
    crate::support::released(held.release().await);
}

#[tokio::test]
async fn a_dropped_acquire_leaves_no_key() {
    let cluster = etcd().await;
    let ns = namespace("dropped");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let prefix = format!("{ns}/door/");
    let mut watch = PrefixWatch::start(&mut client, &prefix).await;

    let held = a.lock("door", &LockOptions::new()).await.expect("lock");
    assert_eq!(watch.next_put().await, held.key());

    let options = LockOptions::new();
    let mut waiting = Box::pin(b.lock("door", &options));
    let queued_key = tokio::select! {
        result = &mut waiting => panic!("acquired a held lock: {:?}", result.map(|g| g.token())),
        key = watch.next_put() => key,
    };
    drop(waiting);
    within(
        Duration::from_secs(5),
        "queue key removed",
        watch.deleted(&queued_key),
    )
    .await;
    assert_eq!(
        keys(&mut client, &prefix).await,
        vec![held.key().to_owned()]
    );

    // Nobody is left in line: the next try after release succeeds at once.
    crate::support::released(held.release().await);
    let next = b.try_lock("door", &options).await.expect("try_lock");
    assert!(next.is_some(), "a ghost waiter kept the lock");
}
