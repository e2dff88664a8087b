//! Compacting the keyspace while waiters wait does not break the queue.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::sync::mpsc;

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_acquire_in_order_after_a_compaction() {
    let cluster = etcd().await;
    let ns = namespace("compaction");
    let holder_locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/door/")).await;

    let holder = holder_locks
        .lock("door", &LockOptions::new())
        .await
        .expect("lock");
    watch.next_put().await;
    let (granted_tx, mut granted) = mpsc::unbounded_channel();
    for id in 0..3 {
        let locks = locker(&cluster, &ns).await;
        let granted_tx = granted_tx.clone();
        tokio::spawn(async move {
            let guard = locks.lock("door", &LockOptions::new()).await.expect("lock");
            granted_tx.send(id).expect("report");
            crate::support::released(guard.release().await);
        });
        watch.next_put().await;
    }

    // Move the store on, then compact everything the waiters may have read or watched from.
    for i in 0..50 {
        client
            .put(format!("{ns}-filler"), i.to_string(), None)
            .await
            .expect("put");
    }
    let compacted = cluster.compact().await.expect("compact");
    assert!(compacted > 50);

    crate::support::released(holder.release().await);
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(
            within(Duration::from_secs(10), "grant", granted.recv())
                .await
                .expect("grant"),
        );
    }
    assert_eq!(order, vec![0, 1, 2]);
}
