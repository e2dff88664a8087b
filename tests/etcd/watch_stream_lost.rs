//! The client's one watch stream breaks while a new lock watch is being asked for on it:
//! the failed request must count as the loss of the whole stream, so that every other
//! watch on it is asked for again; otherwise a waiter on another lock waits for a
//! deletion no watch will ever deliver.

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, address, etcd, locker, locker_through, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_the_stream_broke_under_a_new_watch() {
    let cluster = etcd().await;
    let ns = namespace("stream-lost");
    let holder = locker(&cluster, &ns).await;
    let mut client_etcd = cluster.client().await.expect("client");
    for round in 0..6 {
        let proxy = FaultProxy::start(address(&cluster.endpoint(0)))
            .await
            .expect("proxy");
        let client = locker_through(&proxy, &ns, Duration::from_secs(2)).await;
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let mut watch = PrefixWatch::start(&mut client_etcd, &format!("{ns}/{a}/")).await;
        let held_a = holder.lock(&a, &LockOptions::new()).await.expect("lock a");
        let held_b = holder.lock(&b, &LockOptions::new()).await.expect("lock b");
        watch.next_put().await;
        let waiting = {
            let (client, a) = (client.clone(), a.clone());
            tokio::spawn(async move { client.lock(&a, &LockOptions::new()).await })
        };
        watch.next_put().await;
        // The stream breaks just as a new watch (for b) is asked for on it.
        proxy.sever();
        let short = LockOptions::new().with_wait_timeout(Duration::from_millis(300));
        let _ = client.lock(&b, &short).await;
        proxy.heal();
        crate::support::released(held_a.release().await);
        let granted = within(
            Duration::from_secs(10),
            "the waiter on the other lock is woken",
            waiting,
        )
        .await
        .expect("task")
        .expect("granted");
        crate::support::released(granted.release().await);
        crate::support::released(held_b.release().await);
    }
}
