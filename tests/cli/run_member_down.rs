//! `fencelock run` against three members, one of them down: every run's release and lease
//! revoke go to a live member, and every run exits with its command's status.

use fencelock::testkit::EtcdCluster;

use crate::support::fencelock_run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_run_succeeds_with_one_member_of_three_down() {
    let mut cluster = EtcdCluster::builder()
        .members(3)
        .start()
        .await
        .expect("cluster");
    let leader = cluster.leader().await.expect("leader");
    cluster.kill((leader + 1) % 3).expect("kill a follower");
    let mut failed = Vec::new();
    for run in 0..12 {
        let output = fencelock_run(&cluster.endpoints(), "cli-member-down")
            .args(["--lock", "job", "--", "true"])
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .expect("run");
        if output.status.code() != Some(0) {
            failed.push(format!(
                "run {run}: {:?}: {}",
                output.status.code(),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
