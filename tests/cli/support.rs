//! Helpers shared by the CLI tests.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `fencelock run --etcd <endpoints> --namespace <ns>`, killed if the test drops it. Its
/// stderr is discarded unless the test asks for it (`.stderr(Stdio::piped())`).
pub fn fencelock_run(endpoints: &[String], namespace: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command.args([
        "run",
        "--etcd",
        &endpoints.join(","),
        "--namespace",
        namespace,
    ]);
    command.stderr(std::process::Stdio::null());
    command.kill_on_drop(true);
    command
}

/// Whether `pid` is a running process: some thread of it has not finished (a zombie has
/// finished and only waits to be reaped; but a process whose main thread exited shows as
/// a zombie while its other threads run).
pub fn is_running(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    })
}

/// Ends `pids` with SIGKILL (the leftovers of a test whose assertion is about to fail).
pub fn kill_all(pids: &[i32]) {
    for pid in pids {
        // SAFETY: kill(2) of a process the test's own command started.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
}

/// Waits until none of `pids` runs, for at most `limit`; returns how long it took, or
/// `None` if some still ran. No event tells a test when a process that is not its child
/// ends, so this looks every 10 ms.
pub async fn gone_within(pids: &[i32], limit: Duration) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    loop {
        if pids.iter().all(|pid| !is_running(*pid)) {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Spawns `command` with its standard input, output and error piped: the child, its pid
/// and the lines of its output.
pub fn spawn_piped(command: &mut Command) -> (Child, u32, Lines<BufReader<ChildStdout>>) {
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id().expect("pid");
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, pid, lines)
}

/// The next line the command printed, within 10 s.
pub async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the command prints within 10 s")
        .expect("read")
        .expect("a line")
}

/// The socket address of an `http://host:port` endpoint.
pub fn address(endpoint: &str) -> std::net::SocketAddr {
    endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("endpoint address")
}

/// Wall-clock nanoseconds, comparable with `date +%s%N` in a command's life log.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// A command that ignores SIGTERM (so only SIGKILL stops it), prints `running`, and logs
/// a timestamp to `life` every 10 ms.
pub fn life_script(life: &std::path::Path) -> String {
    format!(
        "trap '' TERM; echo running; while :; do date +%s%N >> {}; sleep 0.01; done",
        life.display()
    )
}

/// The last line of a command's life log: its last sign of life.
pub fn last_sign_of_life(log: &std::path::Path) -> u128 {
    std::fs::read_to_string(log)
        .expect("life log")
        .lines()
        .filter_map(|line| line.trim().parse::<u128>().ok())
        .max()
        .expect("the command wrote at least once")
}

/// Checks a log of `start <token>` / `end <token>` lines written by `runs` commands under
/// one lock: each start is followed by its own end (never two at once), and tokens
/// increase from run to run.
/// Starts `run(order)` for {a, b}, {b, a}, {a, b}, {b, a}, all at once (each a `fencelock
/// run` taking the two locks in that order), and asserts that every one finishes, and
/// succeeds, within 30 s: no two deadlock.
pub async fn run_in_opposite_orders(mut run: impl FnMut([&str; 2]) -> Command) {
    let runs: Vec<_> = [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
        .into_iter()
        .map(|order| run(order).status())
        .collect();
    for run in runs {
        let status = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("no deadlock: every run finishes")
            .expect("runs");
        assert!(status.success(), "{status}");
    }
}

pub fn assert_one_at_a_time(text: &str, runs: usize, what: &str) {
    let lines: Vec<(&str, u64)> = text
        .lines()
        .map(|line| {
            let (event, token) = line.split_once(' ').expect("line");
            (event, token.parse().expect("token"))
        })
        .collect();
    assert_eq!(lines.len(), 2 * runs, "{what}: {text}");
    let mut previous = 0;
    for pair in lines.chunks(2) {
        assert_eq!(pair[0].0, "start", "{what}: {text}");
        assert_eq!(
            pair[1],
            ("end", pair[0].1),
            "{what}: never two at once: {text}"
        );
        assert!(pair[0].1 > previous, "{what}: tokens increase: {text}");
        previous = pair[0].1;
    }
}

/// For a command `trap 'echo terminated' TERM; echo running; read line; echo finished`
/// run with piped stdin, stdout and stderr: lets it finish, then asserts that nothing
/// signalled it (it prints "finished", fencelock exits 0 and reported no renewal trouble).
/// `what` names the fault it rode out.
pub async fn finishes_unsignalled(
    mut fencelock: Child,
    lines: &mut Lines<BufReader<ChildStdout>>,
    what: &str,
) {
    let mut stdin = fencelock.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").await.expect("write");
    assert_eq!(
        next_line(lines).await,
        "finished",
        "the command was signalled ({what})"
    );
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("not being confirmed"),
        "no renewal trouble was reported ({what}): {stderr}"
    );
}

/// Sends `signal` to `pid`, a child the test spawned and has not reaped.
pub fn signal(pid: u32, signal: libc::c_int) {
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: a plain kill(2) to a child this test spawned and has not reaped.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

/// The hexadecimal signal mask `field` (`SigBlk`, `SigIgn`, `SigCgt`) of `pid`'s main
/// thread.
pub fn mask(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .expect(field);
    u64::from_str_radix(line.trim(), 16).expect("a mask")
}

/// `signal`'s bit in a [`mask`].
pub fn bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// The state letter of process `pid` (`/proc/<pid>/stat`), if it is still there.
pub fn state(pid: impl std::fmt::Display) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next()?.chars().next()
}
