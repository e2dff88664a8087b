//! Protected mode: a create applied by the server whose answer never reached the client
//! is found by its id, not made a second time (a second node would queue the client
//! behind its own first one, for as long as its session lives).

use std::time::Duration;

use fencelock::testkit::FaultProxy;
use fencelock::zookeeper::{ZooKeeperGuard, ZooKeeperLocker};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions};
use tokio::task::JoinHandle;
use zookeeper_client::Client;

use crate::support::{admin, await_children, namespace, shared, within};

/// A locker reaching the shared server through a fault proxy, whose first request (the
/// create of the lock's node: its parent exists already) the server applies while the
/// proxy holds the answer.
struct HeldCreate {
    admin: Client,
    proxy: FaultProxy,
    /// The lock's parent node.
    parent: String,
    /// The node the server created, as the admin sees it.
    created: Vec<String>,
    /// The acquisition, running; it returns the locker with its outcome.
    locking: JoinHandle<(ZooKeeperLocker, Result<ZooKeeperGuard, LockError>)>,
}

impl HeldCreate {
    async fn start(ns: &str, request_timeout: Duration) -> Self {
        let cluster = shared();
        let admin = admin(cluster).await;
        let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
            .await
            .expect("proxy");
        let config = cluster
            .config(ns)
            .with_hosts(proxy.address().to_string())
            .with_request_timeout(request_timeout);
        let locker = ZooKeeperLocker::connect(config).await.expect("connect");
        let parent = format!("{ns}/job");
        admin
            .mkdir(
                &parent,
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
            let guard = locker.lock("job", &options).await;
            (locker, guard)
        });
        let created = await_children(&admin, &parent, 1).await;
        Self {
            admin,
            proxy,
            parent,
            created,
            locking,
        }
    }

    /// The acquisition's locker (kept by the caller for as long as the test needs its
    /// session) and guard, which must hold the node the server created.
    async fn guard(&mut self) -> (ZooKeeperLocker, ZooKeeperGuard) {
        let (locker, guard) = within(
            Duration::from_secs(15),
            "the acquisition",
            &mut self.locking,
        )
        .await
        .expect("task");
        let guard = guard.expect("A holds the lock with the node it created");
        assert_eq!(
            guard.path(),
            format!("{}/{}", self.parent, self.created[0]),
            "the node found is the one the server created"
        );
        (locker, guard)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_found_not_repeated() {
    let mut held = HeldCreate::start(&namespace("protected"), Duration::from_millis(300)).await;
    // The server applied the create; its answer is held, then lost with the connection.
    held.proxy.sever();
    held.proxy.heal();
    let (_locker, guard) = held.guard().await;
    assert_eq!(
        await_children(&held.admin, &held.parent, 1).await,
        held.created,
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
    // A request timeout longer than the library's connection timeout (2 s for a 10 s
    // session): the create fails with the library's error, not with the timeout.
    let mut held = HeldCreate::start(&namespace("protected-io"), Duration::from_secs(5)).await;
    // The server applied the create; its answer is held until the library gives the
    // connection up and opens another (the proxy's second), which then goes through.
    within(
        Duration::from_secs(10),
        "a new connection",
        held.proxy.accepted(2),
    )
    .await;
    held.proxy.resume();
    let (_locker, guard) = held.guard().await;
    let _ = guard.release().await;
    assert_eq!(
        await_children(&held.admin, &held.parent, 0).await,
        Vec::<String>::new(),
        "no node left"
    );
}

/// A create whose outcome was unknown may still be applied after the lookup that did not
/// find it (ZooKeeper refuses a moved session's old requests, except through an observer
/// master). Such a node lands behind ours, and once we release it heads the queue with
/// nobody to delete it. Here the late node is made by the test, with the acquisition's
/// id (the server's own late create cannot be timed from outside): the release removes
/// it, and the acquisition's session is retired (the next lock gets a new one, and the
/// old one closes with its last lock, taking any later such node with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_applied_late_is_removed_and_its_session_retired() {
    let mut held =
        HeldCreate::start(&namespace("protected-late"), Duration::from_millis(300)).await;
    held.proxy.sever();
    held.proxy.heal();
    let (locker, guard) = held.guard().await;
    let mine = guard
        .path()
        .rsplit('/')
        .next()
        .expect("a node name")
        .to_owned();
    let id = &mine[..mine.find("-lock-").expect("a lock node")];
    let late = held
        .admin
        .create(
            &format!("{}/{id}-lock-", held.parent),
            b"",
            &zookeeper_client::CreateMode::EphemeralSequential
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .expect("the late create");
    assert_eq!(await_children(&held.admin, &held.parent, 2).await.len(), 2);
    let session = guard.session_id();
    assert_eq!(
        guard.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    assert_eq!(
        await_children(&held.admin, &held.parent, 0).await,
        Vec::<String>::new(),
        "the late node (sequence {}) is removed with ours",
        late.1
    );
    let next = locker
        .lock("job", &LockOptions::new().with_ttl(Duration::from_secs(10)))
        .await
        .expect("the next lock");
    assert_ne!(
        next.session_id(),
        session,
        "the retired session is not reused"
    );
    let _ = next.release().await;
}
