//! No request sent on behalf of one acquisition can delete another acquisition's key,
//! however late it arrives. A client leaves the queue; its delete is held on one path,
//! the client gives up on it and deletes again through the other path; it then takes the
//! lock again; the first delete reaches etcd only now. Had the client reused the key name
//! (as it does once every request about a key was answered), the late delete would remove
//! the new holder's key and hand the lock to the next waiter while the holder still holds
//! it: a name whose delete went unanswered is never used again.

use std::time::Duration;

use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};

use crate::support::{PrefixWatch, TwoPaths, etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_delivered_late_never_removes_the_next_key_of_the_same_name() {
    let cluster = etcd().await;
    let ns = namespace("late-delete");
    let prefix = format!("{ns}/x/");
    let paths = TwoPaths::start(&cluster).await;
    let client = paths.locker(&ns, Duration::from_secs(1)).await;
    let holder = locker(&cluster, &ns).await;
    let next = locker(&cluster, &ns).await;
    let mut etcd_client = cluster.client().await.expect("client");
    let mut watch = PrefixWatch::start(&mut etcd_client, &prefix).await;
    // A long lease: no keep-alive among the requests the proxy keeps.
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));

    let held = holder.lock("x", &options).await.expect("holder");
    let held_key = watch.next_put().await;
    let waiting = {
        let (client, options) = (client.clone(), options.clone());
        tokio::spawn(async move {
            let options = options.with_wait_timeout(Duration::from_millis(500));
            client.lock("x", &options).await.map(drop)
        })
    };
    let first_key = watch.next_put().await;

    // The client's wait times out; path a keeps its delete and breaks the client's
    // connection: the client answers its caller and goes on deleting in the background.
    paths.hold_next_request_on_a();
    let err = within(Duration::from_secs(5), "the wait ends", waiting)
        .await
        .expect("task")
        .expect_err("the lock is held");
    assert!(err.is_wait_timeout(), "{err}");
    paths.a.requests_held(1).await;
    // It deletes again through b, confirmed.
    paths.move_to_b();
    within(
        Duration::from_secs(10),
        "the retried delete",
        watch.deleted(&first_key),
    )
    .await;

    // The holder leaves; the client takes the lock again.
    crate::support::released(held.release().await);
    watch.deleted(&held_key).await;
    let mine = within(
        Duration::from_secs(10),
        "the client's second lock",
        client.lock("x", &options),
    )
    .await
    .expect("second lock");
    watch.next_put().await;
    let behind = {
        let next = next.clone();
        tokio::spawn(async move {
            let guard = next.lock("x", &LockOptions::new()).await?;
            guard.release().await
        })
    };
    watch.next_put().await;

    // The first delete reaches etcd now.
    crate::support::deliver_late(&cluster, &paths.a).await;

    let left = crate::support::keys(&mut etcd_client, &prefix).await;
    assert!(
        left.contains(&mine.key().to_owned()),
        "a late delete removed the holder's key (the next waiter now holds too): {left:?}"
    );
    assert!(mine.is_held());
    assert_eq!(
        mine.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let released = within(Duration::from_secs(10), "the next waiter's turn", behind)
        .await
        .expect("task")
        .expect("next waiter");
    assert_eq!(released, ReleaseOutcome::Released);
}
