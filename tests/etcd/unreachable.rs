//! An endpoint where nothing listens fails within the configured connect timeout.

use std::time::{Duration, Instant};

use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::testkit::free_port;

#[tokio::test]
async fn an_unreachable_endpoint_fails_within_the_connect_timeout() {
    let port = free_port().expect("port");
    let config = EtcdConfig::new([format!("http://127.0.0.1:{port}")])
        .with_connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = EtcdLocker::connect(config)
        .await
        .expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(err.is_unavailable(), "{err}");
    // The bound is the configured timeout plus scheduling slack, not a speed claim.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}
