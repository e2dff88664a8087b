//! Signals whose default action would end fencelock reach the command instead: SIGQUIT
//! (Ctrl-\ at a terminal goes to fencelock's process group, not the command's), SIGUSR1
//! and SIGUSR2 (a log tool's). Before, fencelock died of them: the watchdog killed the
//! command's group, but a descendant that had left the group ran on past the lease, and
//! the lock was never released (it expired).

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, next_line, signal};

/// Says `running`, then `usr1`, `usr2` on those signals, and `quit` on SIGQUIT (and exits
/// 0). `sleep` short: the shell runs a trap once its foreground command ends.
const COMMAND: &str = "trap 'echo usr1' USR1; trap 'echo usr2' USR2; \
                       trap 'echo quit; exit 0' QUIT; echo running; \
                       while :; do sleep 0.05; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_and_user_signals_are_forwarded_to_the_command() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut fencelock = fencelock_run(&[etcd.endpoint(0)], "cli-forwarded")
        .args(["--lock", "job", "--ttl", "3s", "--"])
        .args(["sh", "-c", COMMAND])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = fencelock.id().expect("pid");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    signal(pid, libc::SIGUSR1);
    assert_eq!(next_line(&mut lines).await, "usr1", "SIGUSR1 forwarded");
    signal(pid, libc::SIGUSR2);
    assert_eq!(next_line(&mut lines).await, "usr2", "SIGUSR2 forwarded");
    signal(pid, libc::SIGQUIT);
    assert_eq!(next_line(&mut lines).await, "quit", "SIGQUIT forwarded");
    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    assert_eq!(
        status.code(),
        Some(0),
        "the command's own status: {status:?}"
    );
}
