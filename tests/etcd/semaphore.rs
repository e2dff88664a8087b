//! The etcd semaphore admits exactly N holders at once, in arrival order, and a holder
//! leaving from the middle of the holders still admits the first waiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::{LockError, LockGuard, LockOptions};
use tokio::sync::mpsc;

use crate::support::{PrefixWatch, etcd, locker, namespace, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_holders_at_once() {
    const PERMITS: usize = 3;
    let cluster = etcd().await;
    let ns = namespace("semaphore");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let semaphore = locker(&cluster, &ns)
            .await
            .semaphore("calls", PERMITS)
            .expect("semaphore");
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = semaphore
                    .acquire(&LockOptions::new())
                    .await
                    .expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                released(permit.release().await);
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(60), "all permits", task)
            .await
            .expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} holders at once");
    assert_eq!(
        most, PERMITS,
        "the semaphore should have been full at times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_admitted_in_order_whichever_holder_leaves() {
    let cluster = etcd().await;
    let ns = namespace("semaphore-fifo");
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/pool/")).await;
    let holders = locker(&cluster, &ns)
        .await
        .semaphore("pool", 2)
        .expect("semaphore");
    let options = LockOptions::new();
    let older = holders.acquire(&options).await.expect("permit");
    watch.next_put().await;
    let newer = holders.acquire(&options).await.expect("permit");
    watch.next_put().await;
    assert!(
        holders.try_acquire(&options).await.expect("try").is_none(),
        "full"
    );
    // The refused try put (and removed) a key of its own: skip its event.
    watch.next_put().await;

    let (admitted_tx, mut admitted) = mpsc::unbounded_channel();
    let mut hold = Vec::new();
    for id in 0..3 {
        let semaphore = locker(&cluster, &ns)
            .await
            .semaphore("pool", 2)
            .expect("semaphore");
        let admitted_tx = admitted_tx.clone();
        let (release_tx, mut release_rx) = mpsc::unbounded_channel::<()>();
        hold.push(release_tx);
        tokio::spawn(async move {
            let permit = semaphore
                .acquire(&LockOptions::new())
                .await
                .expect("permit");
            admitted_tx.send((id, permit.token())).expect("report");
            let _ = release_rx.recv().await;
            released(permit.release().await);
        });
        watch.next_put().await; // queued before the next one starts
    }

    // The *newer* holder leaves: the first waiter must get in, though the older holder
    // (the key furthest ahead of it) stays.
    released(newer.release().await);
    let (first, t0) = within(Duration::from_secs(5), "first waiter", admitted.recv())
        .await
        .expect("admitted");
    assert_eq!(first, 0);
    released(older.release().await);
    let (second, t1) = within(Duration::from_secs(5), "second waiter", admitted.recv())
        .await
        .expect("admitted");
    assert_eq!(second, 1);
    let _ = hold[0].send(());
    let (third, t2) = within(Duration::from_secs(5), "third waiter", admitted.recv())
        .await
        .expect("admitted");
    assert_eq!(third, 2);
    assert!(t0 < t1 && t1 < t2, "tokens follow arrival: {t0} {t1} {t2}");
    for release in hold {
        let _ = release.send(());
    }
}

#[tokio::test]
async fn zero_permits_are_refused() {
    let cluster = etcd().await;
    let locks = locker(&cluster, &namespace("semaphore-zero")).await;
    let err = locks.semaphore("pool", 0).expect_err("refused");
    assert!(
        matches!(
            err,
            LockError::InvalidOption {
                option: "permits",
                ..
            }
        ),
        "{err}"
    );
}
