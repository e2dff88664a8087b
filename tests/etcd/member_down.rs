//! One member of three down: every call the library makes goes to a live member.

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockOptions, ReleaseOutcome};

use crate::support::namespace;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_release_and_close_succeed_with_one_member_down() {
    let mut cluster = EtcdCluster::builder()
        .members(3)
        .start()
        .await
        .expect("cluster");
    let ns = namespace("member-down");
    let leader = cluster.leader().await.expect("leader");
    let down = (leader + 1) % 3;
    cluster.kill(down).expect("kill a follower");
    let mut failures = Vec::new();
    for round in 0..20 {
        // A fresh client each time, as each `fencelock run` is.
        let outcome = async {
            let locks = EtcdLocker::connect(cluster.config(&ns)).await?;
            let guard = locks.lock("job", &LockOptions::new()).await?;
            let released = fencelock::LockGuard::release(guard).await?;
            locks.close().await.map(|()| released)
        }
        .await;
        match outcome {
            Ok(ReleaseOutcome::Released) => {}
            Ok(other) => failures.push(format!("round {round}: {other:?}")),
            Err(err) => failures.push(format!("round {round}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
