//! A command that cannot be started costs nobody the lock: the status says why (126 or
//! 127, as a shell would), and the lock is free at once, not after its TTL.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;

use crate::support::fencelock_run;

/// Runs `fencelock run --lock job --ttl 30s -- <command>` and returns its status.
async fn run(etcd: &EtcdCluster, namespace: &str, command: &[&str]) -> Option<i32> {
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        fencelock_run(&etcd.endpoints(), namespace)
            .args(["--lock", "job", "--ttl", "30s", "--"])
            .args(command)
            .status(),
    )
    .await
    .expect("fencelock exits")
    .expect("status");
    status.code()
}

/// The lock is free right away: a second run with a 1 s wait gets it.
async fn assert_free(etcd: &EtcdCluster, namespace: &str) {
    let status = fencelock_run(&etcd.endpoints(), namespace)
        .args(["--lock", "job", "--wait", "1s", "--", "true"])
        .status()
        .await
        .expect("status");
    assert_eq!(status.code(), Some(0), "the lock was not free at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_exits_127_and_a_file_that_cannot_run_126() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    assert_eq!(
        run(&etcd, "cli-start", &["/no/such/program"]).await,
        Some(127)
    );
    assert_free(&etcd, "cli-start").await;
    // Not executable.
    assert_eq!(run(&etcd, "cli-start", &["/etc/passwd"]).await, Some(126));
    assert_free(&etcd, "cli-start").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_fails_to_start_after_the_lock_was_taken_releases_it_at_once() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    // Executable, so it passes every check before the lock; its interpreter does not
    // exist, so starting it fails only at exec, with the lock held.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("job.sh");
    std::fs::write(&script, "#!/no/such/interpreter\necho never\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = script.display().to_string();
    assert_eq!(run(&etcd, "cli-exec", &[&script]).await, Some(127));
    assert_free(&etcd, "cli-exec").await;
}
