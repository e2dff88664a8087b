//! The watchdog of `fencelock run` outlives a SIGTERM sent to every process (a service
//! manager stopping a unit, `kill` of a whole session): only fencelock's own end may end
//! it, so that a fencelock that dies afterwards still takes the command's group with it.
//! Before issue 21 the watchdog ignored SIGINT and SIGHUP but died of SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, gone_within, next_line};

/// The pid of the `run-watchdog` process among the children of `parent`.
fn watchdog_of(parent: i32) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains("run-watchdog")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_to_the_watchdog_does_not_leave_the_group_unguarded() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut fencelock = fencelock_run(&[etcd.endpoint(0)], "cli-watchdog-term")
        .args(["--lock", "job", "--ttl", "2s", "--"])
        .args(["sh", "-c", "sleep 30 & echo $!; echo running; wait"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let fencelock_pid = i32::try_from(fencelock.id().expect("pid")).expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    let background: i32 = next_line(&mut lines).await.parse().expect("pid");
    assert_eq!(next_line(&mut lines).await, "running");
    let watchdog = watchdog_of(fencelock_pid).expect("the watchdog runs");
    // SAFETY: kill(2) of processes this test started.
    unsafe {
        libc::kill(watchdog, libc::SIGTERM);
        libc::kill(fencelock_pid, libc::SIGKILL);
    }
    let gone = gone_within(&[background], Duration::from_secs(5)).await;
    if gone.is_none() {
        // SAFETY: the test's own leftover.
        unsafe {
            libc::kill(background, libc::SIGKILL);
        }
    }
    assert!(
        gone.is_some(),
        "the command's background process outlived fencelock and its watchdog"
    );
}
