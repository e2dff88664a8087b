//! The INCR token increases across successive holders (on a healthy single server).

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{locker, prefix, redis, released};

#[tokio::test]
async fn each_holder_gets_a_larger_token() {
    let server = redis().await;
    let prefix = prefix("tokens");
    let a = locker(&server, &prefix).await;
    let b = locker(&server, &prefix).await;
    let mut previous = None;
    for round in 0..10 {
        let locks = if round % 2 == 0 { &a } else { &b };
        let guard = locks
            .lock("ledger", &LockOptions::new())
            .await
            .expect("lock");
        let counter = server
            .get(&format!("{prefix}:token:ledger"))
            .await
            .expect("get");
        assert_eq!(counter, Some(guard.token().to_string()));
        assert!(previous.is_none_or(|p| p < guard.token()));
        previous = Some(guard.token());
        released(guard.release().await);
    }
}
