//! Leader election: observers see the leader and its proclamations; when the leader's
//! lease dies the next candidate takes over with a larger token, and the old leader can
//! no longer proclaim.

use std::time::Duration;

use fencelock::{LockError, LockOptions};

use crate::support::{etcd, locker, namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_hands_over_with_an_increasing_token() {
    let cluster = etcd().await;
    let ns = namespace("election");
    let a = locker(&cluster, &ns)
        .await
        .election("scheduler")
        .expect("election");
    let b = locker(&cluster, &ns)
        .await
        .election("scheduler")
        .expect("election");
    let observer_side = locker(&cluster, &ns)
        .await
        .election("scheduler")
        .expect("election");
    let mut observer = observer_side.observe();
    assert_eq!(
        observer.next().await.expect("observe"),
        None,
        "no leader yet"
    );

    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let leader_a = a.campaign("host-a", &options).await.expect("A elected");
    let seen = within(Duration::from_secs(5), "A observed", observer.next())
        .await
        .expect("observe");
    let seen = seen.expect("a leader");
    assert_eq!(
        (seen.value.as_slice(), seen.token),
        (b"host-a".as_slice(), leader_a.token())
    );

    leader_a.proclaim("host-a:8080").await.expect("proclaim");
    let seen = within(Duration::from_secs(5), "proclamation", observer.next())
        .await
        .expect("observe");
    assert_eq!(
        seen.as_ref().map(|l| l.value.as_slice()),
        Some(b"host-a:8080".as_slice())
    );

    let candidate = {
        let options = options.clone();
        tokio::spawn(async move { b.campaign("host-b", &options).await })
    };
    // The leader dies: its lease is revoked, as if its process and keep-alives stopped.
    let mut client = cluster.client().await.expect("client");
    client
        .lease_revoke(leader_a.guard().lease_id())
        .await
        .expect("revoke");
    within(Duration::from_secs(5), "A learns it lost", leader_a.lost()).await;

    let leader_b = within(Duration::from_secs(5), "B elected", candidate)
        .await
        .expect("task")
        .expect("campaign");
    assert!(leader_b.token() > leader_a.token());
    let seen = within(Duration::from_secs(5), "B observed", observer.next())
        .await
        .expect("observe");
    assert_eq!(seen.map(|l| l.token), Some(leader_b.token()));

    let err = leader_a
        .proclaim("stale")
        .await
        .expect_err("A is not the leader");
    assert!(matches!(err, LockError::NotHeld { .. }), "{err}");

    let _ = leader_b.resign().await.expect("resign");
    let seen = within(Duration::from_secs(5), "resignation", observer.next())
        .await
        .expect("observe");
    assert_eq!(seen, None);
}
