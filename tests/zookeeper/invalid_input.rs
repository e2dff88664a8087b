//! Bad names, options and configurations are refused before anything is sent.

use std::time::Duration;

use fencelock::zookeeper::{ZooKeeperConfig, ZooKeeperLocker};
use fencelock::{LockBackend, LockOptions};

use crate::support::{locker, namespace, shared};

#[tokio::test]
async fn bad_names_options_and_configs_are_refused() {
    let locks = locker(shared(), &namespace("invalid")).await;
    let err = locks
        .lock("a/b", &LockOptions::new())
        .await
        .expect_err("a slash");
    assert!(err.is_invalid_input(), "{err}");
    let err = locks
        .try_lock(
            "ok",
            &LockOptions::new().with_ttl(Duration::from_millis(10)),
        )
        .await
        .expect_err("a tiny TTL");
    assert!(err.is_invalid_input(), "{err}");
    let config = ZooKeeperConfig::new(shared().connect_string()).with_namespace("relative");
    let err = ZooKeeperLocker::connect(config)
        .await
        .expect_err("a relative namespace");
    assert!(err.is_invalid_input(), "{err}");
}

#[tokio::test]
async fn an_unreachable_ensemble_is_reported_as_such() {
    let port = fencelock::testkit::free_port().expect("port");
    let config = ZooKeeperConfig::new(format!("127.0.0.1:{port}"))
        .with_connect_timeout(Duration::from_secs(2));
    let err = ZooKeeperLocker::connect(config)
        .await
        .expect_err("nobody listens");
    assert!(err.is_unavailable(), "{err}");
}
