//! With etcd auth on, wrong credentials are refused with a typed error; right ones work.

use fencelock::etcd::EtcdLocker;
use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, namespace};

#[tokio::test]
async fn wrong_credentials_are_refused_and_right_ones_work() {
    let cluster = etcd().await;
    let mut admin = cluster.client().await.expect("client");
    admin
        .user_add("root", "rootpw", None)
        .await
        .expect("add root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    admin.auth_enable().await.expect("enable auth");
    let ns = namespace("auth");

    let wrong = cluster.config(&ns).with_credentials("root", "wrong");
    let err = EtcdLocker::connect(wrong).await.expect_err("refused");
    assert!(err.is_permission_denied(), "{err}");

    let anonymous = EtcdLocker::connect(cluster.config(&ns))
        .await
        .expect_err("refused");
    assert!(anonymous.is_permission_denied(), "{anonymous}");

    let right = cluster.config(&ns).with_credentials("root", "rootpw");
    let locks = EtcdLocker::connect(right).await.expect("connect");
    let guard = locks
        .lock("secure", &LockOptions::new())
        .await
        .expect("lock");
    crate::support::released(guard.release().await);
}
