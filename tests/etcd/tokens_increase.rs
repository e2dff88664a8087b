//! Tokens strictly increase across successive holders, from any client.

use fencelock::{LockBackend, LockGuard, LockOptions};

use crate::support::{etcd, locker, namespace};

#[tokio::test]
async fn each_holder_gets_a_larger_token_than_the_last() {
    let cluster = etcd().await;
    let ns = namespace("tokens");
    let a = locker(&cluster, &ns).await;
    let b = locker(&cluster, &ns).await;
    let mut previous = None;
    for round in 0..10 {
        let locks = if round % 2 == 0 { &a } else { &b };
        let guard = locks
            .lock("ledger", &LockOptions::new())
            .await
            .expect("lock");
        // The token is the key's create revision, as etcd reports it.
        let mut client = cluster.client().await.expect("client");
        let stored = client.get(guard.key(), None).await.expect("get");
        let create_revision = stored.kvs()[0].create_revision();
        assert_eq!(
            guard.token().get(),
            u64::try_from(create_revision).expect("positive")
        );
        if let Some(previous) = previous {
            assert!(
                guard.token() > previous,
                "{} after {previous}",
                guard.token()
            );
        }
        previous = Some(guard.token());
        crate::support::released(guard.release().await);
    }
}
