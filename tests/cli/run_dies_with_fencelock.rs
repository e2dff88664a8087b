//! `fencelock run` killed outright (SIGKILL: no handler, no destructor runs): its command,
//! and what the command started, die with it.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, gone_within, is_running, next_line};

/// Rounds per test: the death comes right after the command started, the moment a
/// command not yet registered with the watchdog would escape (before the fix, 7 of 30
/// single rounds on a loaded machine left the background `sleep` running).
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_and_its_background_processes_die_with_fencelock() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    for round in 0..ROUNDS {
        let mut command = fencelock_run(&etcd.endpoints(), "cli-dies");
        // A lock per round: the killed fencelock's lease holds its lock for the TTL.
        let lock = format!("job-{round}");
        command
            .args(["--lock", lock.as_str(), "--ttl", "10s", "--"])
            // A shell with a background job, both long-running.
            .args(["sh", "-c", "sleep 300 & echo \"$$ $!\"; sleep 300"])
            .stdout(Stdio::piped());
        let mut fencelock = command.spawn().expect("spawn");
        let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
        let pids: Vec<i32> = next_line(&mut lines)
            .await
            .split_whitespace()
            .map(|pid| pid.parse().expect("pid"))
            .collect();
        assert_eq!(pids.len(), 2);
        assert!(pids.iter().all(|pid| is_running(*pid)));

        fencelock.start_kill().expect("SIGKILL fencelock");
        fencelock.wait().await.expect("reaped");
        let took = gone_within(&pids, Duration::from_secs(1)).await;
        let left: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|pid| is_running(*pid))
            .collect();
        // Clean up after a failure, so that nothing outlives the test either way.
        for pid in &left {
            // SAFETY: kill(2) of a process this test's command started.
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        assert!(
            took.is_some(),
            "round {round}: still running 1 s after fencelock died: {left:?}"
        );
    }
}
