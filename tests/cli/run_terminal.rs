//! `fencelock run` on a terminal (a pseudo-terminal from `script`). The command runs in a
//! process group of its own, in the terminal's background: Ctrl-Z must not stop
//! fencelock (a stopped fencelock renews nothing while the command runs on past the
//! lease), and a command that reads the terminal must not be stopped for good with its
//! lock renewed. Before issue 21 both hung.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// `fencelock run <args> -- sh -c <script>` on a pseudo-terminal of its own: `script`
/// runs it as the terminal's foreground job, and what the test writes to `script`'s
/// stdin is typed on that terminal.
fn on_terminal(etcd: &EtcdCluster, ns: &str, script: &str) -> Child {
    let quoted = script.replace('\'', r"'\''");
    let line = format!(
        "exec {} run --etcd {} --namespace {ns} --lock job --ttl 2s -- sh -c '{quoted}'",
        env!("CARGO_BIN_EXE_fencelock"),
        etcd.endpoint(0),
    );
    Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("script")
}

/// Reads the terminal's output until a line that contains `wanted`, within 10 s.
async fn until_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    wanted: &str,
) -> String {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let line = lines.next_line().await.expect("read").expect("a line");
            if line.contains(wanted) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line with {wanted:?} within 10 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_z_does_not_stop_fencelock_while_the_command_runs() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    // An interactive shell with job control, as a user has: it runs fencelock as a
    // foreground job (a process group that the terminal stops on Ctrl-Z; without a shell
    // in the session to resume it, the kernel would discard the stop signal instead).
    let mut terminal = Command::new("script")
        .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("script");
    let mut typed = terminal.stdin.take().expect("stdin");
    let mut lines = BufReader::new(terminal.stdout.take().expect("stdout")).lines();
    // The terminal echoes what is typed: the markers are spelt with empty quotes, so that
    // only the output of the commands matches them.
    let line = format!(
        "{} run --etcd {} --namespace cli-terminal-stop --lock job --ttl 2s -- \
         sh -c 'echo run\"\"ning; sleep 3; echo fin\"\"ished'; echo exit-\"\"status $?\n",
        env!("CARGO_BIN_EXE_fencelock"),
        etcd.endpoint(0),
    );
    typed.write_all(line.as_bytes()).await.expect("type");
    until_line(&mut lines, "running").await;
    // Ctrl-Z: SIGTSTP to the foreground job, fencelock's process group.
    typed.write_all(b"\x1a").await.expect("type");
    until_line(&mut lines, "finished").await;
    let status = until_line(&mut lines, "exit-status").await;
    assert!(
        status.contains("exit-status 0"),
        "fencelock was stopped (148) while its command ran on: {status}"
    );
    typed.write_all(b"exit\n").await.expect("type");
    let _ = tokio::time::timeout(Duration::from_secs(5), terminal.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_reads_the_terminal_is_not_stopped_for_good() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut terminal = on_terminal(
        &etcd,
        "cli-terminal-read",
        "echo running; read answer; echo \"read status $?\"",
    );
    let typed = terminal.stdin.take().expect("stdin");
    let mut lines = BufReader::new(terminal.stdout.take().expect("stdout")).lines();
    until_line(&mut lines, "running").await;
    let line = until_line(&mut lines, "read status").await;
    assert!(
        !line.contains("read status 0"),
        "a read from the terminal in the background fails instead of stopping: {line}"
    );
    let status = tokio::time::timeout(Duration::from_secs(10), terminal.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    assert!(status.success(), "{status}");
    drop(typed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_fencelock_is_not_stopped_by_its_own_output_under_tostop() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut terminal = Command::new("script")
        .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("script");
    let mut typed = terminal.stdin.take().expect("stdin");
    let mut lines = BufReader::new(terminal.stdout.take().expect("stdout")).lines();
    // In the background, with `tostop`: a write to the terminal stops the writer's group.
    let line = format!(
        "stty tostop; {} run --etcd {} --namespace cli-terminal-tostop --lock job --ttl 2s -- \
         sh -c 'echo run\"\"ning; sleep 2; echo fin\"\"ished' &\n",
        env!("CARGO_BIN_EXE_fencelock"),
        etcd.endpoint(0),
    );
    typed.write_all(line.as_bytes()).await.expect("type");
    until_line(&mut lines, "running").await;
    // SIGTSTP while it holds: refused, with a line on stderr, the terminal.
    typed
        .write_all(b"kill -TSTP %1; wait %1; echo exit-\"\"status $?\n")
        .await
        .expect("type");
    until_line(&mut lines, "finished").await;
    let status = until_line(&mut lines, "exit-status").await;
    assert!(
        status.contains("exit-status 0"),
        "fencelock was stopped by its own diagnostic (SIGTTOU): {status}"
    );
    typed.write_all(b"exit\n").await.expect("type");
    let _ = tokio::time::timeout(Duration::from_secs(5), terminal.wait()).await;
}
