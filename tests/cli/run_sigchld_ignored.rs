//! `fencelock run` started by a parent that ignores SIGCHLD (inherited through `exec`:
//! Python daemons, some supervisors). The kernel would reap the command the moment it
//! exits: before issue 21 `run` then lost its status (exit 70) and released the lock
//! with the command's background processes still running.

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockOptions};

use crate::support::is_running;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_ignoring_sigchld_changes_neither_the_status_nor_the_group_kill() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-sigchld";
    let dir = tempfile::tempdir().expect("tempdir");
    let background = dir.path().join("background");
    let script = format!("sleep 20 & echo $! > {}; exit 3", background.display());
    let status = tokio::process::Command::new("python3")
        .args([
            "-c",
            "import os, signal, sys\n\
             signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n\
             os.execvp(sys.argv[1], sys.argv[1:])",
            env!("CARGO_BIN_EXE_fencelock"),
            "run",
            "--etcd",
            &etcd.endpoint(0),
            "--namespace",
            ns,
            "--lock",
            "job",
            "--ttl",
            "2s",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(Duration::from_secs(20), status)
        .await
        .expect("fencelock exits")
        .expect("status");
    // The next holder starts now; the background `sleep` must be gone already.
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let granted = next
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock was released");
    let sleep: i32 = std::fs::read_to_string(&background)
        .expect("the command started its background process")
        .trim()
        .parse()
        .expect("a pid");
    let left_running = is_running(sleep);
    if left_running {
        // SAFETY: kill(2) of the test's own leftover process.
        unsafe {
            libc::kill(sleep, libc::SIGKILL);
        }
    }
    assert_eq!(status.code(), Some(3), "the command's own status");
    assert!(
        !left_running,
        "the command's background process outlived the lock"
    );
    drop(granted);
}
