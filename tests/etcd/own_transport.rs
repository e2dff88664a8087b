//! fencelock's own HTTP/2 transport for the sessions' key-value requests
//! (`src/grpc_transport/`): a connection that goes silent is left for a new one once a
//! request on it is given up, and a configuration can turn the transport off.

use std::time::{Duration, Instant};

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{address, etcd, namespace, released};

/// A locker reaching one member by two paths, with 500 ms requests, and the path its
/// transport connection goes through (tonic's channel opens one connection on each; the
/// transport one more, on the member it starts with, chosen at random) with that
/// connection's number there.
struct TwoPaths {
    a: FaultProxy,
    b: FaultProxy,
    locks: fencelock::etcd::EtcdLocker,
}

impl TwoPaths {
    async fn start(cluster: &fencelock::testkit::EtcdCluster) -> Self {
        let member = address(&cluster.endpoint(0));
        let a = FaultProxy::start(member).await.expect("proxy a");
        let b = FaultProxy::start(member).await.expect("proxy b");
        let config = fencelock::etcd::EtcdConfig::new([a.http_url(), b.http_url()])
            .with_namespace(namespace("own-transport"))
            .with_request_timeout(Duration::from_millis(500));
        let locks = fencelock::etcd::EtcdLocker::connect(config)
            .await
            .expect("connect");
        Self { a, b, locks }
    }

    /// Started, a lock taken and released, then the transport's connection silenced.
    async fn silenced_after_a_lock(cluster: &fencelock::testkit::EtcdCluster) -> Self {
        let paths = Self::start(cluster).await;
        let guard = paths
            .locks
            .lock("x", &options())
            .await
            .expect("lock before");
        released(guard.release().await);
        paths.silence_the_transport();
        paths
    }

    /// The transport's connection goes silent for good (its peer crashed behind an
    /// address that still answers); the other path and every new connection work.
    fn silence_the_transport(&self) {
        self.transport_path().blackhole(2);
    }

    /// The path the transport's connection goes through (connection 2 there).
    fn transport_path(&self) -> &FaultProxy {
        let accepted = [&self.a, &self.b].map(FaultProxy::connections_accepted);
        match accepted {
            [2, 1] => &self.a,
            [1, 2] => &self.b,
            other => panic!("one connection each for tonic, one more for the transport: {other:?}"),
        }
    }
}

fn options() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait_timeout(Duration::from_secs(5))
}

/// The transport's connection goes silent between two locks, and locks are tried again
/// and again from then on: the first request given up unanswered leaves the connection,
/// so a lock is taken within a few request timeouts, not after a ping's answer time
/// (5 s) or the periodic keep-alive (10 s, then 5 s). Before: 5.5 s (a ping when a
/// request was given up), 10.1 s (the periodic ping alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_left_once_a_request_on_it_is_given_up() {
    let cluster = etcd().await;
    let paths = TwoPaths::silenced_after_a_lock(&cluster).await;
    let silent = Instant::now();
    let wait = options().with_wait_timeout(Duration::from_secs(1));
    let mut failures = Vec::new();
    let guard = loop {
        match paths.locks.lock("x", &wait).await {
            Ok(guard) => break guard,
            Err(err) => failures.push(err.to_string()),
        }
        assert!(silent.elapsed() < Duration::from_secs(4), "{failures:?}");
    };
    let took = silent.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "a lock {took:?} after: {failures:?}"
    );
    released(guard.release().await);
}

/// The transport's connection goes silent while no request is on it (a load balancer
/// forgot the flow): the next lock's first request times out, and its retry goes out on
/// a new connection, so the lock is taken. Before, the retry went on the same silent
/// connection and the lock failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_while_idle_costs_a_request_not_the_lock() {
    let cluster = etcd().await;
    let paths = TwoPaths::silenced_after_a_lock(&cluster).await;
    let guard = paths
        .locks
        .lock("x", &options())
        .await
        .expect("the retry goes out on a new connection");
    released(guard.release().await);
}

/// `with_own_transport(false)`: everything goes through tonic's channel, which opens one
/// connection per endpoint, and locks work as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_can_be_turned_off() {
    let cluster = etcd().await;
    let member = address(&cluster.endpoint(0));
    let proxy = FaultProxy::start(member).await.expect("proxy");
    for (own, connections) in [(true, 2), (false, 1)] {
        let before = proxy.connections_accepted();
        let config = fencelock::etcd::EtcdConfig::new([proxy.http_url()])
            .with_namespace(namespace("own-transport-off"))
            .with_own_transport(own);
        let locks = fencelock::etcd::EtcdLocker::connect(config)
            .await
            .expect("connect");
        let guard = locks.lock("x", &LockOptions::new()).await.expect("lock");
        released(guard.release().await);
        assert_eq!(
            proxy.connections_accepted() - before,
            connections,
            "own transport {own}"
        );
        locks.close().await.expect("close");
    }
}
