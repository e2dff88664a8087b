//! Protected mode: a create applied by the server whose answer never reached the client
//! is found by its id, not made a second time (a second node would queue the client
//! behind its own first one, for as long as its session lives).

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{admin, await_children, namespace, shared, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_found_not_repeated() {
    let cluster = shared();
    let ns = namespace("protected");
    let admin = admin(cluster).await;
    let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
        .await
        .expect("proxy");
    let config = cluster
        .config(&ns)
        .with_hosts(proxy.address().to_string())
        .with_request_timeout(Duration::from_millis(300));
    let a = ZooKeeperLocker::connect(config).await.expect("connect");
    // The lock's node exists already, so that the create is the first request.
    admin
        .mkdir(
            &format!("{ns}/job"),
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .expect("mkdir");

    proxy.hold_answers();
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(8));
    let locking = tokio::spawn(async move {
        let guard = a.lock("job", &options).await;
        (a, guard)
    });
    // The server applied the create; its answer is held, then lost with the connection.
    let created = await_children(&admin, &format!("{ns}/job"), 1).await;
    proxy.sever();
    proxy.heal();
    let (_a, guard) = within(Duration::from_secs(15), "the acquisition", locking)
        .await
        .expect("task");
    let guard = guard.expect("A holds the lock with the node it created");
    assert_eq!(
        guard.path(),
        format!("{ns}/job/{}", created[0]),
        "the node found is the one the server created"
    );
    assert_eq!(
        await_children(&admin, &format!("{ns}/job"), 1).await,
        created,
        "no second node"
    );
    let _ = guard.release().await;
}

/// The same, when the client library gives the connection up while the create waits for
/// its answer (no answer for a fifth of the session timeout): it fails the request with
/// an error of its own ("no response from connection"; an I/O error does the same), not
/// `ConnectionLoss`. The outcome is just as unknown: the node is looked for, not left
/// behind in the queue under a live session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_connection_the_library_gave_up_is_found_not_left() {
    let cluster = shared();
    let ns = namespace("protected-io");
    let admin = admin(cluster).await;
    let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
        .await
        .expect("proxy");
    // A request timeout longer than the library's connection timeout (2 s for a 10 s
    // session): the create fails with the library's error, not with the timeout.
    let config = cluster
        .config(&ns)
        .with_hosts(proxy.address().to_string())
        .with_request_timeout(Duration::from_secs(5));
    let a = ZooKeeperLocker::connect(config).await.expect("connect");
    admin
        .mkdir(
            &format!("{ns}/job"),
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .expect("mkdir");

    proxy.hold_answers();
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(8));
    let locking = tokio::spawn(async move {
        let guard = a.lock("job", &options).await;
        (a, guard)
    });
    // The server applied the create; its answer is held until the library gives the
    // connection up and opens another (the proxy's second), which then goes through.
    let created = await_children(&admin, &format!("{ns}/job"), 1).await;
    within(
        Duration::from_secs(10),
        "a new connection",
        proxy.accepted(2),
    )
    .await;
    proxy.resume();
    let (_a, guard) = within(Duration::from_secs(15), "the acquisition", locking)
        .await
        .expect("task");
    let guard = guard.expect("A holds the lock with the node it created");
    assert_eq!(
        guard.path(),
        format!("{ns}/job/{}", created[0]),
        "the node found is the one the server created"
    );
    let _ = guard.release().await;
    assert_eq!(
        await_children(&admin, &format!("{ns}/job"), 0).await,
        Vec::<String>::new(),
        "no node left"
    );
}
