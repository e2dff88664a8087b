//! fencelock stopped (SIGSTOP, a debugger, a suspended machine) past its lease while the
//! command finishes: once it runs again it sees the command's end only then, after the
//! lease ran out and another client was granted the lock. It cannot tell whether the
//! command finished before the lease ran out, so it must not report the command's own
//! status as a run under the lock. Before, it did whenever the release then failed too
//! (the lock service unreachable): exit 0, "finished with the lock held".

use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, FaultProxy};
use fencelock::{LockBackend, LockOptions};
use tokio::io::AsyncWriteExt;

use crate::support::{
    address, bit, fencelock_run, is_running, next_line, signal, spawn_piped, state,
};

/// The lock `job`, granted to `next` once fencelock's lease ran out.
async fn passed_on(next: &EtcdLocker) -> fencelock::etcd::EtcdGuard {
    next.lock(
        "job",
        &LockOptions::new().with_wait_timeout(Duration::from_secs(20)),
    )
    .await
    .expect("the lock passes on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_end_is_seen_after_the_lease_ran_out_is_reported_lost() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-paused";
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let (mut fencelock, pid, mut lines) = spawn_piped(
        fencelock_run(&[proxy.http_url()], ns)
            .args(["--lock", "job", "--ttl", "2s", "--"])
            // Runs until the test writes a line, then succeeds.
            .args(["sh", "-c", "echo running; read line; exit 0"]),
    );
    assert_eq!(next_line(&mut lines).await, "running");

    // fencelock stops; the command finishes while it is stopped.
    signal(pid, libc::SIGSTOP);
    let mut stdin = fencelock.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").await.expect("write");
    // Its lease runs out (nothing renews it): another client is granted the lock.
    let granted = passed_on(&next).await;
    // fencelock resumes cut off from etcd: its release cannot tell it anything.
    proxy.cut();
    signal(pid, libc::SIGCONT);
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    proxy.heal();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(76),
        "the command may have run without the lock: {stderr}"
    );
    drop(granted);
}

/// As above, with the pause while a process the command left behind is given its
/// grace: that process ends while fencelock is stopped, and fencelock, resumed after the
/// lease ran out, finds nothing left to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_whose_end_is_seen_after_the_lease_ran_out_are_reported_lost() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-paused-leftover";
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    // The command leaves a process behind (its pid in a file, the command ending only
    // then) that, on fencelock's SIGTERM to what is left, stops fencelock (its
    // grandparent: the command's parent) and ends: the pause comes in the grace, at once.
    let pid_file = dir.path().join("leftover");
    let script = format!(
        "f=$PPID; sh -c \"trap 'kill -STOP $f; exit 0' TERM; echo \\$\\$ > {pids}; \
         while :; do sleep 0.05; done\" & \
         while [ ! -s {pids} ]; do sleep 0.01; done; exit 0",
        pids = pid_file.display()
    );
    let mut fencelock = fencelock_run(&[proxy.http_url()], ns)
        .args(["--lock", "job", "--ttl", "3s", "--grace", "1s", "--"])
        .args(["sh", "-c", &script])
        .spawn()
        .expect("spawn");
    let pid = i32::try_from(fencelock.id().expect("pid")).expect("pid");
    tokio::time::timeout(Duration::from_secs(10), async {
        while !std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.trim().is_empty()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the leftover started");
    let leftover: i32 = std::fs::read_to_string(&pid_file)
        .expect("the leftover's pid")
        .trim()
        .parse()
        .expect("a pid");
    // fencelock stopped by the leftover, which has ended (a zombie fencelock cannot reap
    // while stopped).
    tokio::time::timeout(Duration::from_secs(10), async {
        while state(pid) != Some('T') || is_running(leftover) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("fencelock stopped and the leftover ended");
    // Its lease runs out: another client is granted the lock.
    let granted = passed_on(&next).await;
    proxy.cut();
    signal(u32::try_from(pid).expect("pid"), libc::SIGCONT);
    let status = tokio::time::timeout(Duration::from_secs(20), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    proxy.heal();
    assert_eq!(
        status.code(),
        Some(76),
        "what the command left may have run without the lock"
    );
    drop(granted);
}

/// Whether `pid` has received SIGKILL: it has ended, or the signal waits for it to run.
fn killed(pid: u32) -> bool {
    let pending = |field| {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
            status.lines().any(|line| {
                line.strip_prefix(field)
                    .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                    .is_some_and(|mask| mask & bit(libc::SIGKILL) != 0)
            })
        })
    };
    !is_running(i32::try_from(pid).expect("pid")) || pending("SigPnd:") || pending("ShdPnd:")
}

/// fencelock stopped while its command runs on: nothing in fencelock can kill the command
/// at the lease deadline, so its watchdog (a process of its own, not stopped with it)
/// does, from the last deadline fencelock told it. Before, the command ran on past the
/// deadline and while the next holder held the lock, until fencelock ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_a_stopped_fencelock_is_killed_at_the_lease_deadline() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-paused-watchdog";
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let (fencelock, pid, mut lines) = spawn_piped(
        fencelock_run(&[etcd.endpoint(0)], ns)
            .args(["--lock", "job", "--ttl", "2s", "--"])
            .args(["sh", "-c", "echo $$; exec sleep 60"]),
    );
    let command: u32 = next_line(&mut lines)
        .await
        .parse()
        .expect("the command's pid");

    signal(pid, libc::SIGSTOP);
    // Nothing renews the lease: another client is granted the lock after its deadline.
    let granted = passed_on(&next).await;
    let killed_by_then = killed(command);
    signal(pid, libc::SIGCONT);
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        killed_by_then,
        "the command still ran when the next holder was granted the lock: {stderr}"
    );
    assert_eq!(output.status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("the lease deadline passed without word from fencelock"),
        "{stderr}"
    );
    drop(granted);
}
