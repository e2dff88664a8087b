//! The read-write lock: readers overlap, a writer is never with anyone, and a waiting
//! writer holds back the readers that arrive after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::{LockGuard, LockOptions};

use crate::support::{PrefixWatch, etcd, locker, namespace, released, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_waiting_writer_goes_first() {
    let cluster = etcd().await;
    let ns = namespace("rwlock");
    let mut client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut client, &format!("{ns}/catalog/")).await;
    let lock = locker(&cluster, &ns)
        .await
        .rwlock("catalog")
        .expect("rwlock");
    let options = LockOptions::new();

    let r1 = lock.read(&options).await.expect("read");
    let r2 = lock.read(&options).await.expect("a second reader at once");
    assert!(
        lock.try_write(&options).await.expect("try").is_none(),
        "readers hold it"
    );
    for _ in 0..3 {
        watch.next_put().await; // r1, r2, and the refused try
    }

    let writer_side = locker(&cluster, &ns)
        .await
        .rwlock("catalog")
        .expect("rwlock");
    let writer = tokio::spawn(async move { writer_side.write(&LockOptions::new()).await });
    watch.next_put().await; // the writer is in line
    assert!(
        lock.try_read(&options).await.expect("try").is_none(),
        "a reader arriving after a waiting writer waits behind it"
    );

    let last_reader = r2.token();
    released(r1.release().await);
    released(r2.release().await);
    let w = within(Duration::from_secs(5), "writer admitted", writer)
        .await
        .expect("task")
        .expect("write");
    assert!(w.token() > last_reader);
    assert!(
        lock.try_read(&options).await.expect("try").is_none(),
        "the writer is alone"
    );
    released(w.release().await);
    let r3 = lock
        .try_read(&options)
        .await
        .expect("try")
        .expect("free for readers again");
    released(r3.release().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_is_never_with_anyone() {
    let cluster = etcd().await;
    let ns = namespace("rwlock-mix");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let lock = locker(&cluster, &ns).await.rwlock("mix").expect("rwlock");
        let (readers, writers) = (readers.clone(), writers.clone());
        let (violations, most_readers) = (violations.clone(), most_readers.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..6usize {
                let options = LockOptions::new();
                if (t + i) % 3 == 0 {
                    let guard = lock.write(&options).await.expect("write");
                    if writers.fetch_add(1, Ordering::SeqCst) > 0
                        || readers.load(Ordering::SeqCst) > 0
                    {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    released(guard.release().await);
                } else {
                    let guard = lock.read(&options).await.expect("read");
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(now, Ordering::SeqCst);
                    if writers.load(Ordering::SeqCst) > 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    released(guard.release().await);
                }
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(60), "all done", task)
            .await
            .expect("task");
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a writer overlapped someone"
    );
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never overlapped"
    );
}
