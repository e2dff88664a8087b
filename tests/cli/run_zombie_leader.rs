//! A process whose main thread has exited shows as a zombie (`Z`) while its other
//! threads work on. Before issue 35 `fencelock run` counted it as finished and released
//! the lock while it still ran; now a process counts as running while any thread of it
//! does.

use std::time::Duration;

use fencelock::testkit::EtcdCluster;

use crate::support::{fencelock_run, is_running, kill_all};

/// In the background: a Python process that starts a working thread, writes its pid, and
/// ends its main thread (`pthread_exit`), leaving the thread to run. The command exits
/// once that process shows as a zombie.
const HALF_EXITED: &str = "\
    python3 -c '
import ctypes, os, threading, time
def work():
    while True:
        time.sleep(0.01)
threading.Thread(target=work).start()
with open(\"pid\", \"w\") as f:
    f.write(str(os.getpid()))
ctypes.CDLL(None).pthread_exit(None)
' >/dev/null 2>&1 &
    until [ -s pid ] && grep -q '^State:.*Z' /proc/$(cat pid)/status; do sleep 0.01; done
    exit 0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_main_thread_exited_is_waited_for() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = fencelock_run(&etcd.endpoints(), "cli-zombie-leader");
    command
        .args(["--lock", "job", "--ttl", "3s", "--grace", "500ms", "--"])
        .args(["sh", "-c", HALF_EXITED])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped());
    let output = tokio::time::timeout(Duration::from_secs(10), command.output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .expect("the pid file")
        .trim()
        .parse()
        .expect("a pid");
    let still_running = is_running(pid);
    if still_running {
        kill_all(&[pid]);
    }
    assert!(!still_running, "its thread outlived the lock");
    assert_eq!(output.status.code(), Some(0), "the command's own status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("left 1 process"), "{stderr}");
}
