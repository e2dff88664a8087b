//! `fencelock run` cut off from etcd while its command runs: the command is dead before
//! anyone else can be granted the lock, every time, and the exit status says the lock was
//! lost although the release and the revoke then fail.

use std::process::Stdio;
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, FaultProxy};
use fencelock::{LockBackend, LockOptions};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{
    address, bit, fencelock_run, last_sign_of_life, life_script, mask, next_line, now_ns, signal,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_is_dead_before_the_next_grant_every_time() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-cut";
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut margins = Vec::new();
    for run in 0..5 {
        let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
            .await
            .expect("proxy");
        let life = dir.path().join(format!("life-{run}"));
        let script = life_script(&life);
        let mut fencelock = fencelock_run(&[proxy.http_url()], ns)
            .args(["--lock", "job", "--ttl", "1s", "--grace", "500ms", "--"])
            .args(["sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
        // The command runs under the lock; now cut fencelock off from etcd.
        assert_eq!(next_line(&mut lines).await, "running");
        proxy.cut();

        // Another client waits for the lock; the grant is when it gets it.
        let granted = next
            .lock(
                "job",
                &LockOptions::new().with_wait_timeout(Duration::from_secs(10)),
            )
            .await
            .expect("the lock passes on");
        let grant = now_ns();
        let status = tokio::time::timeout(Duration::from_secs(20), fencelock.wait())
            .await
            .expect("fencelock exits")
            .expect("status");
        proxy.heal();
        let last = last_sign_of_life(&life);
        assert!(
            last < grant,
            "run {run}: the command wrote {} ms after the next grant",
            (last - grant) / 1_000_000
        );
        margins.push((grant - last) / 1_000_000);
        assert_eq!(status.code(), Some(76), "run {run}: the lock was lost");
        drop(granted);
    }
    eprintln!("last sign of life before the next grant, ms: {margins:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_completed_keeps_its_status_when_etcd_is_unreachable_afterwards() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let mut fencelock = fencelock_run(&[proxy.http_url()], "cli-cut-after")
        .args(["--lock", "job", "--ttl", "2s", "--"])
        // Runs until the test writes a line, then fails with its own status, 3.
        .args(["sh", "-c", "echo running; read line; exit 3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    // etcd becomes unreachable, and the command finishes, with the lock still held.
    proxy.cut();
    let mut stdin = fencelock.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"go\n")
        .await
        .expect("write");
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    proxy.heal();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(3),
        "the command's own status: {stderr}"
    );
    assert!(
        stderr.contains("warning"),
        "the failed release is reported: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_exits_0_on_fencelocks_sigterm_is_not_reported_as_success() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let mut fencelock = fencelock_run(&[proxy.http_url()], "cli-cut-term")
        .args(["--lock", "job", "--ttl", "2s", "--grace", "500ms", "--"])
        // Handles SIGTERM by exiting 0, as many jobs do.
        .args([
            "sh",
            "-c",
            "trap 'echo terminated; exit 0' TERM; echo running; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    // Renewals stop being confirmed: fencelock sends SIGTERM before the lease deadline.
    proxy.cut();
    assert_eq!(next_line(&mut lines).await, "terminated");
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    proxy.heal();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(143),
        "a command fencelock interrupted is never reported as success: {stderr}"
    );
}

/// Whether `pid` catches `signal` (its `SigCgt` mask in `/proc`).
fn catches(pid: u32, signal: libc::c_int) -> bool {
    mask(pid, "SigCgt") & bit(signal) != 0
}

/// Once the command is gone, a Ctrl-C ends fencelock again, also while its release waits
/// for a lock service that does not answer (up to the TTL). Before, the handler that
/// forwarded it to the command stayed installed, and swallowed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigint_while_the_release_waits_ends_fencelock() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let mut fencelock = fencelock_run(&[proxy.http_url()], "cli-cut-sigint")
        .args(["--lock", "job", "--ttl", "10s", "--"])
        .args(["sh", "-c", "echo running; read line; exit 0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = fencelock.id().expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    assert!(catches(pid, libc::SIGINT), "caught, for the command");
    // etcd becomes unreachable, and the command finishes: the release waits.
    proxy.cut();
    let mut stdin = fencelock.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"go\n")
        .await
        .expect("write");
    tokio::time::timeout(Duration::from_secs(5), async {
        while catches(pid, libc::SIGINT) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("SIGINT is fencelock's own again once the command is gone");
    signal(pid, libc::SIGINT);
    let status = tokio::time::timeout(Duration::from_secs(3), fencelock.wait())
        .await
        .expect("fencelock ends at once, not when its release gives up")
        .expect("status");
    proxy.heal();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
}
