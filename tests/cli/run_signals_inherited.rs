//! What a parent passes on through `exec`: a mask of blocked signals, and ignored ones.
//! Before issue 35 a SIGTERM that the parent had blocked stayed pending in fencelock for
//! ever (never forwarded, the command ran on); and under `nohup` fencelock caught SIGHUP,
//! forwarded it, and the command died of the hang-up `nohup` was meant to shield it from.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{bit, mask, next_line};

/// Tells the signals it has blocked and whether SIGHUP is ignored, says `running`, and
/// then `hup` on SIGHUP, `term` on SIGTERM (and exits 0).
const COMMAND: &str = "\
import signal, sys, time
print('blocked', sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
print('hup ignored', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True)
def term(*_):
    print('term', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
signal.signal(signal.SIGHUP, lambda *_: print('hup', flush=True))
print('running', flush=True)
while True:
    time.sleep(0.05)
";

/// `fencelock run` under `launcher` (its arguments first), for `COMMAND`.
fn under(launcher: &[&str], etcd: &EtcdCluster, namespace: &str) -> Command {
    let mut command = Command::new(launcher[0]);
    command
        .args(&launcher[1..])
        .arg(env!("CARGO_BIN_EXE_fencelock"))
        .args(["run", "--etcd", &etcd.endpoint(0), "--namespace", namespace])
        .args([
            "--lock", "job", "--ttl", "3s", "--", "python3", "-c", COMMAND,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_blocked_by_the_parent_is_still_forwarded() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    // SIGHUP's disposition reset first: a test runner started under `nohup` passes on
    // an ignored SIGHUP, which this test is not about (`under_nohup_...` is).
    let blocking = [
        "python3",
        "-c",
        "import os, signal, sys\n\
         signal.signal(signal.SIGHUP, signal.SIG_DFL)\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})\n\
         os.execvp(sys.argv[1], sys.argv[1:])",
    ];
    let mut fencelock = under(&blocking, &etcd, "cli-mask").spawn().expect("spawn");
    let pid = fencelock.id().expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(
        next_line(&mut lines).await,
        "blocked []",
        "the command starts with nothing blocked"
    );
    assert_eq!(next_line(&mut lines).await, "hup ignored False");
    assert_eq!(next_line(&mut lines).await, "running");
    assert_eq!(
        mask(pid, "SigBlk") & bit(libc::SIGTERM),
        0,
        "fencelock's own"
    );
    // SAFETY: kill(2) of the fencelock this test started.
    unsafe {
        libc::kill(i32::try_from(pid).expect("pid"), libc::SIGTERM);
    }
    assert_eq!(
        next_line(&mut lines).await,
        "term",
        "forwarded to the command"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "the command's own status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_nohup_a_hangup_is_not_forwarded() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut fencelock = under(&["nohup"], &etcd, "cli-nohup")
        .spawn()
        .expect("spawn");
    let pid = fencelock.id().expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "blocked []");
    assert_eq!(
        next_line(&mut lines).await,
        "hup ignored True",
        "the command ignores SIGHUP, as under nohup"
    );
    assert_eq!(next_line(&mut lines).await, "running");
    assert_ne!(mask(pid, "SigIgn") & bit(libc::SIGHUP), 0, "still ignored");
    assert_eq!(mask(pid, "SigCgt") & bit(libc::SIGHUP), 0, "not caught");
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: kill(2) of the fencelock this test started.
    unsafe {
        libc::kill(pid, libc::SIGHUP);
        libc::kill(pid, libc::SIGTERM);
    }
    assert_eq!(
        next_line(&mut lines).await,
        "term",
        "the hang-up never reached the command"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "the command's own status");
}
