//! A session reuses a lock key's name once the key is confirmed gone, so etcd's index of
//! dead keys (visited by every range read over the lock until the next compaction) stays
//! as small as the number of acquisitions running at once; tokens still increase.

use std::collections::BTreeSet;

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, locker, namespace};

#[tokio::test]
async fn a_hot_lock_reuses_one_key_name_and_its_tokens_still_increase() {
    let cluster = etcd().await;
    let ns = namespace("key-names");
    let locks = locker(&cluster, &ns).await;
    let mut names = BTreeSet::new();
    let mut previous = None;
    for _ in 0..20 {
        let guard = locks.lock("hot", &LockOptions::new()).await.expect("lock");
        names.insert(guard.key().to_owned());
        assert!(previous < Some(guard.token()), "tokens increase");
        previous = Some(guard.token());
        crate::support::released(guard.release().await);
    }
    assert_eq!(names.len(), 1, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_at_once_on_one_lock_get_names_of_their_own() {
    let cluster = etcd().await;
    let ns = namespace("key-slots");
    let locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/busy/")).await;
    let held = locks.lock("busy", &LockOptions::new()).await.expect("lock");
    watch.next_put().await;
    // Two more tasks of the same session queue behind it: each with its own key.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let guard = locks.lock("busy", &LockOptions::new()).await?;
                guard.release().await
            })
        })
        .collect();
    let queued = [watch.next_put().await, watch.next_put().await];
    let mut all: BTreeSet<String> = queued.iter().cloned().collect();
    all.insert(held.key().to_owned());
    assert_eq!(all.len(), 3, "{all:?}");
    crate::support::released(held.release().await);
    for waiter in waiters {
        crate::support::released(waiter.await.expect("task"));
    }
}
