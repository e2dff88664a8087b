//! The backend contract (`fencelock::testkit::conformance`) on etcd: three clients, the
//! lease revoked behind the holder's back.

use fencelock::etcd::EtcdGuard;
use fencelock::testkit::conformance::Contract;

use crate::support::{etcd, locker, namespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_backend_contract() {
    let cluster = etcd().await;
    let ns = namespace("contract");
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(locker(&cluster, &ns).await);
    }
    let admin = cluster.client().await.expect("admin client");
    Contract::new(clients)
        .with_take_away(move |guard: &EtcdGuard| {
            let (mut admin, lease) = (admin.clone(), guard.lease_id());
            Box::pin(async move {
                admin.lease_revoke(lease).await.expect("revoke");
            })
        })
        .run_all()
        .await;
}
