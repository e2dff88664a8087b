//! What leaves the command's process group is still the command's: GNU `timeout` moves
//! itself and its child into a group of their own, `setsid` starts a session. Before
//! issue 35 `fencelock run` waited for the group only, and released the lock with both
//! still running; now it is their reaper (`PR_SET_CHILD_SUBREAPER`), finds them by pid,
//! and stops them before the release.

use std::time::Duration;

use fencelock::testkit::EtcdCluster;

use crate::support::{fencelock_run, is_running, kill_all};

/// `timeout 60 sleep 60 &` and `setsid sleep 60 &` (each sleep writing its pid first,
/// `timeout`'s pid too), output to /dev/null; the command exits once all three are
/// written.
const ESCAPING: &str = "\
    timeout 60 sh -c 'echo $$ > timed; exec sleep 60' >/dev/null 2>&1 &
    echo $! > timeout
    setsid sh -c 'echo $$ > session; exec sleep 60' >/dev/null 2>&1 &
    until [ -s timed ] && [ -s session ]; do sleep 0.01; done
    exit 0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_leave_the_group_are_stopped_before_the_release() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = fencelock_run(&etcd.endpoints(), "cli-escapes");
    command
        .args(["--lock", "job", "--ttl", "3s", "--grace", "500ms", "--"])
        .args(["sh", "-c", ESCAPING])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped());
    let output = tokio::time::timeout(Duration::from_secs(10), command.output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let pids: Vec<i32> = ["timeout", "timed", "session"]
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(dir.path().join(file)).expect("a pid file");
            text.trim().parse().expect("a pid")
        })
        .collect();
    let left: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|pid| is_running(*pid))
        .collect();
    kill_all(&left);
    assert!(left.is_empty(), "{left:?} of {pids:?} outlived the lock");
    assert_eq!(output.status.code(), Some(0), "the command's own status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("left 3 process(es)"), "{stderr}");
}

/// Ten orphans (each `true &` of a shell that exits at once, its pid written down), then
/// how many of them are still in the process table (a zombie is, until it is reaped),
/// once none is or after 5 s.
const ORPHANING: &str = "\
    for i in 1 2 3 4 5 6 7 8 9 10; do sh -c 'true & echo $! >> orphans'; done
    left() { n=0; for pid in $(cat orphans); do [ -e /proc/$pid ] && n=$((n + 1)); done; echo $n; }
    i=0
    while [ $(left) -gt 0 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
    left";

/// Being their reaper, fencelock reaps the orphans of a command that runs on: a command
/// that orphans processes all day must not fill the process table with zombies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_handed_to_fencelock_are_reaped_while_the_command_runs() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = fencelock_run(&etcd.endpoints(), "cli-orphans");
    command
        .args(["--lock", "job", "--ttl", "3s", "--"])
        .args(["sh", "-c", ORPHANING])
        .current_dir(dir.path());
    let output = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .expect("fencelock exits")
        .expect("output");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "0",
        "orphans left unreaped while the command runs"
    );
}
