//! The read-write lock: readers share, a writer excludes everyone, and a waiting writer
//! holds back the readers that come after it (writers do not starve). Tokens are czxids.

use std::time::Duration;

use fencelock::{LockGuard, LockOptions};

use crate::support::{admin, await_children, locker, namespace, shared, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_writer_waits_for_them_and_holds_back_later_readers() {
    let cluster = shared();
    let ns = namespace("rwlock");
    let (a, b) = (locker(cluster, &ns).await, locker(cluster, &ns).await);
    let admin = admin(cluster).await;
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let (catalog_a, catalog_b) = (
        a.rwlock("catalog").expect("rwlock"),
        b.rwlock("catalog").expect("rwlock"),
    );

    let first = catalog_a.read(&options).await.expect("a reader");
    let second = within(
        Duration::from_secs(5),
        "a second reader",
        catalog_b.read(&options),
    )
    .await
    .expect("readers share");
    assert!(first.is_held() && second.is_held());
    assert!(
        catalog_b
            .try_write(&options)
            .await
            .expect("answers")
            .is_none(),
        "a writer beside readers"
    );

    // A writer queues up behind both readers.
    let writer = tokio::spawn({
        let (catalog, options) = (catalog_b.clone(), options.clone());
        async move { catalog.write(&options).await }
    });
    await_children(&admin, &format!("{ns}/catalog"), 3).await;
    assert!(
        catalog_a
            .try_read(&options)
            .await
            .expect("answers")
            .is_none(),
        "a reader went ahead of the waiting writer"
    );
    assert!(
        !writer.is_finished(),
        "the writer went ahead of the readers"
    );

    let last_reader_token = first.token().max(second.token());
    let _ = first.release().await;
    assert!(!writer.is_finished(), "the writer went ahead of a reader");
    let _ = second.release().await;
    let writing = within(Duration::from_secs(5), "the writer", writer)
        .await
        .expect("task")
        .expect("the writer is granted once the readers are gone");
    assert!(writing.token() > last_reader_token);
    assert!(
        catalog_a
            .try_read(&options)
            .await
            .expect("answers")
            .is_none(),
        "a reader beside the writer"
    );
    let _ = writing.release().await;
    let reading = catalog_a
        .try_read(&options)
        .await
        .expect("answers")
        .expect("free again");
    let _ = reading.release().await;
}
