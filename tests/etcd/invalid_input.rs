//! Bad names, options and settings are refused with typed errors, and nothing is written.

use std::time::Duration;

use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::{LockBackend, LockError, LockOptions};

use crate::support::{etcd, keys, locker, namespace};

#[tokio::test]
async fn bad_names_and_options_are_refused_before_anything_is_written() {
    let cluster = etcd().await;
    let ns = namespace("invalid");
    let locks = locker(&cluster, &ns).await;
    let mut client = cluster.client().await.expect("client");

    for name in ["", "a/b", "has space", &"n".repeat(129)] {
        let err = locks.lock(name, &LockOptions::new()).await.expect_err(name);
        assert!(
            matches!(err, LockError::InvalidName { .. }),
            "{name:?}: {err}"
        );
        let err = locks
            .try_lock(name, &LockOptions::new())
            .await
            .expect_err(name);
        assert!(
            matches!(err, LockError::InvalidName { .. }),
            "{name:?}: {err}"
        );
    }
    let bad_options = [
        LockOptions::new().with_ttl(Duration::ZERO),
        LockOptions::new().with_ttl(Duration::from_millis(500)),
        LockOptions::new().with_ttl(Duration::from_secs(2 * 24 * 3600)),
        LockOptions::new().with_wait_timeout(Duration::ZERO),
    ];
    for options in bad_options {
        let err = locks.lock("fine", &options).await.expect_err("refused");
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{options:?}: {err}"
        );
    }
    assert!(keys(&mut client, &format!("{ns}/")).await.is_empty());
}

#[tokio::test]
async fn bad_settings_are_refused_without_connecting() {
    let settings = [
        EtcdConfig::new(Vec::<String>::new()),
        EtcdConfig::new(["not an endpoint"]),
        EtcdConfig::new(["http://127.0.0.1:2379"]).with_namespace(""),
        EtcdConfig::new(["http://127.0.0.1:2379"]).with_namespace("trailing/"),
    ];
    for config in settings {
        let err = EtcdLocker::connect(config.clone())
            .await
            .expect_err("refused");
        assert!(
            matches!(err, LockError::InvalidConfig { .. }),
            "{config:?}: {err}"
        );
    }
}
