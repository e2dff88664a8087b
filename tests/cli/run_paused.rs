//! fencelock stopped (SIGSTOP, a debugger, a suspended machine) past its lease while the
//! command finishes: once it runs again it sees the command's end only then, after the
//! lease ran out and another client was granted the lock. It cannot tell whether the
//! command finished before the lease ran out, so it must not report the command's own
//! status as a run under the lock. Before, it did whenever the release then failed too
//! (the lock service unreachable): exit 0, "finished with the lock held".

use std::process::Stdio;
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, FaultProxy};
use fencelock::{LockBackend, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::{address, fencelock_run, next_line};

fn signal(pid: u32, signal: libc::c_int) {
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: a plain kill(2) to a child this test spawned and has not reaped.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_end_is_seen_after_the_lease_ran_out_is_reported_lost() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-paused";
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let mut fencelock = fencelock_run(&[proxy.http_url()], ns)
        .args(["--lock", "job", "--ttl", "2s", "--"])
        // Runs until the test writes a line, then succeeds.
        .args(["sh", "-c", "echo running; read line; exit 0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = fencelock.id().expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");

    // fencelock stops; the command finishes while it is stopped.
    signal(pid, libc::SIGSTOP);
    let mut stdin = fencelock.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").await.expect("write");
    // Its lease runs out (nothing renews it): another client is granted the lock.
    let granted = next
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(20)),
        )
        .await
        .expect("the lock passes on");
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
