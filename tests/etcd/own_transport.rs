//! fencelock's own HTTP/2 transport for the sessions' key-value requests
//! (`src/grpc_transport/`): a connection that goes silent is left for the next member
//! soon after a request on it is given up, and a configuration can turn it off.

use std::time::{Duration, Instant};

use fencelock::testkit::FaultProxy;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{address, etcd, namespace, released};

/// A member reached by two paths: the transport's connection goes through path a. That
/// connection goes silent (a crashed peer behind an address that still answers): the
/// next lock must go through b within the request's timeout and one ping's answer time
/// (5 s), not wait for the periodic keep-alive (10 s, then 5 s to answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_left_soon_after_a_request_on_it_is_given_up() {
    let cluster = etcd().await;
    let member = address(&cluster.endpoint(0));
    let a = FaultProxy::start(member).await.expect("proxy a");
    let b = FaultProxy::start(member).await.expect("proxy b");
    let config = fencelock::etcd::EtcdConfig::new([a.http_url(), b.http_url()])
        .with_namespace(namespace("own-transport"))
        .with_request_timeout(Duration::from_millis(500));
    let locks = fencelock::etcd::EtcdLocker::connect(config)
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    released(
        locks
            .lock("x", &options)
            .await
            .expect("lock before")
            .release()
            .await,
    );
    // Connecting proves tonic's channel first, then the transport's own connection (to
    // the first endpoint): the last one path a accepted.
    let transport = a.connections_accepted();
    assert!(transport >= 2, "tonic's and the transport's: {transport}");
    a.blackhole(transport);
    let silent = Instant::now();
    let wait = options.clone().with_wait_timeout(Duration::from_secs(2));
    let mut failures = Vec::new();
    let guard = loop {
        match locks.lock("x", &wait).await {
            Ok(guard) => break guard,
            Err(err) => failures.push(err.to_string()),
        }
        assert!(
            silent.elapsed() < Duration::from_secs(9),
            "still no lock {:?} after the connection went silent: {failures:?}",
            silent.elapsed()
        );
    };
    assert!(
        !failures.is_empty(),
        "the silent connection was not in use: the test proves nothing"
    );
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
