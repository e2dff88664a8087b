//! A waiter whose session dies stops waiting with a lease-lost error.

use std::time::Duration;

use fencelock::{LockBackend, LockOptions};

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test]
async fn waiter_stops_with_lease_lost_when_its_session_dies() {
    let cluster = etcd().await;
    let ns = namespace("waiter-session");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/door/")).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(3));

    let held = a.lock("door", &options).await.expect("lock");
    watch.next_put().await;
    let waiter_session = b.session(options.ttl()).await.expect("session");
    let waiter = {
        let options = options.clone();
        tokio::spawn(async move { b.lock("door", &options).await.map(drop) })
    };
    watch.next_put().await;

    client
        .lease_revoke(waiter_session.lease_id())
        .await
        .expect("revoke");
    let result = within(Duration::from_secs(5), "waiter gives up", waiter)
        .await
        .expect("task");
    let err = result.expect_err("waiter must not get the lock");
    assert!(err.is_lost(), "{err}");
    drop(held);
}
