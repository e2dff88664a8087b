//! `fencelock run` where `/proc` does not list a process's children (a kernel without
//! `CONFIG_PROC_CHILDREN`, an emulated `/proc`): every look for the command's processes
//! walks those lists, so nothing the command left behind would ever be found, and the
//! lock would be released while it ran. Injected: fencelock runs as pid 1 of a pid and
//! mount namespace of its own, with `/dev/null` bound over its main thread's list (a
//! list that reads, and is always empty). It must refuse (70) without running the
//! command. Before, it ran it.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_that_lists_no_children_runs_nothing() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = dir.path().join("ran");
    // `exec` keeps the shell's pid, 1, and its thread: fencelock's main thread.
    let hide = "mount --bind /dev/null /proc/1/task/1/children && exec \"$@\"";
    let output = Command::new("unshare")
        .args([
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            hide,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "run",
            "--etcd",
            &etcd.endpoint(0),
            "--namespace",
            "cli-no-children",
        ])
        .args(["--lock", "job", "--", "touch"])
        .arg(&ran)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("fencelock exits")
        .expect("unshare runs (root, util-linux)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert!(!ran.exists(), "the command ran: {stderr}");
    assert!(stderr.contains("children"), "{stderr}");
}
