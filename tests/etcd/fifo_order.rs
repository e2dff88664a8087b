//! Waiters are granted the lock in the order they joined the queue.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::sync::mpsc;

use crate::support::{PrefixWatch, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let cluster = etcd().await;
    let ns = namespace("fifo");
    let holder_locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let prefix = format!("{ns}/queue/");
    let mut watch = PrefixWatch::start(&mut client, &prefix).await;

    let holder = holder_locks
        .lock("queue", &LockOptions::new())
        .await
        .expect("lock");
    assert_eq!(watch.next_put().await, holder.key());

    // Start the waiters one by one; each joins the queue (its key appears) before the next.
    let (granted_tx, mut granted) = mpsc::unbounded_channel();
    let mut waiter_keys = Vec::new();
    for id in 0..5 {
        let locks = locker(&cluster, &ns).await;
        let granted_tx = granted_tx.clone();
        tokio::spawn(async move {
            let guard = locks
                .lock("queue", &LockOptions::new())
                .await
                .expect("lock");
            granted_tx.send((id, guard.token())).expect("report");
            crate::support::released(guard.release().await);
        });
        waiter_keys.push(within(Duration::from_secs(5), "waiter enqueued", watch.next_put()).await);
    }
    assert_eq!(waiter_keys.len(), 5);

    crate::support::released(holder.release().await);
    let mut order = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let (id, token) = within(Duration::from_secs(10), "next grant", granted.recv())
            .await
            .expect("grant");
        assert!(last.is_none_or(|last| last < token), "tokens out of order");
        last = Some(token);
        order.push(id);
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
}
