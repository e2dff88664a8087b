//! The lock is released only after the command's whole process group is gone: what the
//! command leaves behind does not run on without the lock.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, is_running, next_line};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_left_by_the_shell_is_stopped_before_the_release() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut command = fencelock_run(&etcd.endpoints(), "cli-leftovers");
    command
        .args(["--lock", "job", "--ttl", "3s", "--grace", "500ms", "--"])
        // The shell exits at once, leaving a background job behind.
        .args(["sh", "-c", "sleep 300 & echo $!"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut fencelock = command.spawn().expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    let background: i32 = next_line(&mut lines).await.parse().expect("pid");
    let output = tokio::time::timeout(Duration::from_secs(10), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let still_running = is_running(background);
    if still_running {
        // SAFETY: kill(2) of the process this test's command started.
        unsafe {
            libc::kill(background, libc::SIGKILL);
        }
    }
    assert!(!still_running, "the background job outlived the lock");
    assert_eq!(output.status.code(), Some(0), "the command's own status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("left 1 process"), "{stderr}");
}
