//! `fencelock run` whose stderr is a pipe nobody reads (a stuck log shipper), already
//! full: cut off from etcd, it still kills the command's group before anyone else is
//! granted the lock. Before issue 21 it wrote its warning before signalling, blocked on
//! the full pipe, and the command ran on past the lease.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::testkit::{EtcdCluster, FaultProxy};
use fencelock::{LockBackend, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{address, fencelock_run, last_sign_of_life, next_line, now_ns};

/// A pipe: (reading end, writing end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors, which we then own.
    let made = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(made, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// How many bytes wait in the pipe, and how many it holds.
fn fill(reader: &OwnedFd) -> (i32, i32) {
    use std::os::fd::AsRawFd;
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; F_GETPIPE_SZ takes no argument.
    unsafe {
        libc::ioctl(reader.as_raw_fd(), libc::FIONREAD, &mut waiting);
        (waiting, libc::fcntl(reader.as_raw_fd(), libc::F_GETPIPE_SZ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stderr_pipe_does_not_delay_the_kill_past_the_lease() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-stderr-stuck";
    let proxy = FaultProxy::start(address(&etcd.endpoint(0)))
        .await
        .expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let life = dir.path().join("life");
    let (reader, writer) = pipe();
    let mut fencelock = fencelock_run(&[proxy.http_url()], ns)
        .args(["--lock", "job", "--ttl", "1s", "--grace", "300ms", "--"])
        .args([
            "sh",
            "-c",
            &format!(
                "trap '' TERM; head -c 300000 /dev/zero >&2 & echo running; \
                 while :; do date +%s%N >> {}; sleep 0.01; done",
                life.display()
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(writer))
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    // The pipe fills up (no event says so: look every 10 ms).
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (waiting, size) = fill(&reader);
            if waiting >= size {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command fills fencelock's stderr");
    proxy.cut();
    let next = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
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
        .expect("fencelock exits although nobody reads its stderr")
        .expect("status");
    proxy.heal();
    let last = last_sign_of_life(&life);
    assert!(
        last < grant,
        "the command wrote {} ms after the next grant",
        (last - grant) / 1_000_000
    );
    assert_eq!(status.code(), Some(76));
    drop(granted);
    drop(reader);
}
