//! The watchdog of `fencelock run` outlives a SIGTERM sent to every process (a service
//! manager stopping a unit, `kill` of a whole session): only fencelock's own end may end
//! it, so that a fencelock that dies afterwards still takes the command's group with it.
//! Before issue 21 the watchdog ignored SIGINT and SIGHUP but died of SIGTERM; after it,
//! a SIGTERM that came while the watchdog was still starting (before its own `signal()`
//! calls) still killed it, which CI met once. The test now signals from the watchdog's
//! exec on.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fencelock::testkit::{EtcdCluster, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::run_redis::fencelock_on;
use crate::support::{fencelock_run, gone_within, kill_all, next_line, signal, spawn_piped, state};

/// The pid of the `run-watchdog` process among the children of `parent` (read from each
/// of its threads' `children` list: much faster than a scan of `/proc`, so that the test
/// sees the watchdog within moments of its exec).
fn watchdog_of(parent: i32) -> Option<i32> {
    std::fs::read_dir(format!("/proc/{parent}/task"))
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .filter_map(|pid| pid.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("run-watchdog")
        })
}

/// Sends SIGTERM to the watchdog of `fencelock` from the moment it has exec'd (its
/// command line names it) until `stop` is set and at least one signal was sent, as often
/// as the test can find it: the first signals land while the watchdog is still starting
/// up, which is where the race was. (On a loaded machine this thread may not run at all
/// before the command has started: it then goes on signalling the running watchdog,
/// which must survive that too, for up to 10 s.) Returns how many signals were sent, in
/// all and before `stop` was set.
fn terminate_watchdog_until(fencelock: i32, stop: &AtomicBool) -> (usize, usize) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    let (mut sent, mut before_stop) = (0, 0);
    loop {
        let stopped = stop.load(Ordering::Acquire);
        if (stopped && sent > 0) || std::time::Instant::now() >= give_up {
            return (sent, before_stop);
        }
        if let Some(watchdog) = watchdog_of(fencelock) {
            // SAFETY: kill(2) of a process this test's fencelock started.
            unsafe {
                libc::kill(watchdog, libc::SIGTERM);
            }
            sent += 1;
            if !stopped {
                before_stop += 1;
            }
        }
        std::thread::yield_now();
    }
}

/// SIGKILLs fencelock and waits up to 5 s for the command's `background` process to be
/// gone, as its watchdog should see to; ends it itself if not (no leftover outlives the
/// test). Whether it was gone in time.
async fn killed_with(fencelock: i32, background: i32) -> bool {
    // SAFETY: kill(2) of the process this test started.
    unsafe {
        libc::kill(fencelock, libc::SIGKILL);
    }
    let gone = gone_within(&[background], Duration::from_secs(5)).await;
    if gone.is_none() {
        kill_all(&[background]);
    }
    gone.is_some()
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
    // SIGTERMs from the watchdog's first moments on, through the command's start.
    let stop = Arc::new(AtomicBool::new(false));
    let terminator = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || terminate_watchdog_until(fencelock_pid, &stop)
    });
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the command prints within 10 s")
        .expect("read");
    let Some(first) = first else {
        stop.store(true, Ordering::Release);
        let (sent, _) = terminator.join().expect("the signalling thread");
        let status = fencelock.wait().await.expect("wait");
        panic!(
            "fencelock run never started its command ({status}): the watchdog died of one \
             of the {sent} SIGTERMs sent to it during its start"
        );
    };
    let background: i32 = first.parse().expect("pid");
    assert_eq!(next_line(&mut lines).await, "running");
    stop.store(true, Ordering::Release);
    let (sent, started) = terminator.join().expect("the signalling thread");
    assert!(sent > 0, "the test never found the watchdog to signal");
    // Whether the start-up window was covered shows in the log (zero: only signals to the
    // running watchdog, on a machine too busy to schedule the thread earlier).
    eprintln!("SIGTERMs sent to the watchdog before its command's start was seen: {started}");
    let gone = killed_with(fencelock_pid, background).await;
    assert!(
        gone,
        "the command's background process outlived fencelock and its watchdog \
         ({sent} SIGTERMs sent to the watchdog from its start on)"
    );
}

/// The other signals that would end a process by default, sent to the watchdog alone
/// (`systemctl kill -s USR1` signals every process of a unit, to have logs reopened):
/// fencelock forwards them to its command and lives on, and so must the watchdog, or a
/// later death of fencelock leaves the command's group unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_signals_to_the_watchdog_do_not_leave_the_group_unguarded() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut fencelock = fencelock_run(&[etcd.endpoint(0)], "cli-watchdog-stray")
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
    let stray = [
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGSTKFLT,
        libc::SIGTRAP,
        libc::SIGSYS,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGTSTP,
        libc::SIGRTMIN(),
        libc::SIGRTMAX(),
    ];
    for signal in stray {
        // SAFETY: kill(2) of a process this test's fencelock started.
        unsafe {
            libc::kill(watchdog, signal);
        }
    }
    let gone = killed_with(fencelock_pid, background).await;
    assert!(
        gone,
        "the command's background process outlived fencelock: the watchdog died of a stray \
         signal"
    );
}

/// The watchdog alone stopped (SIGSTOP cannot be ignored) while renewals go on: the
/// deadlines fencelock sends it queue in its pipe, more of them than one read takes in
/// (a lease of 1 s renewed some 3 times a second, for 10 s). Resumed, it must act on the
/// latest deadline, not on a stale one from the middle of the queue: before, it killed the
/// healthy command at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_resumed_after_a_stop_acts_on_the_latest_deadline() {
    let redis = RedisServer::start().await.expect("redis");
    let (mut fencelock, pid, mut lines) = spawn_piped(
        fencelock_on("redis", &[redis.url()], "cli-watchdog-stopped")
            .args(["--lock", "job", "--ttl", "1s", "--"])
            .args(["sh", "-c", "echo running; read line; exit 0"]),
    );
    assert_eq!(next_line(&mut lines).await, "running");
    let watchdog = watchdog_of(i32::try_from(pid).expect("pid")).expect("the watchdog runs");
    let watchdog = u32::try_from(watchdog).expect("pid");

    signal(watchdog, libc::SIGSTOP);
    // The fault's length, not a wait for an event: the deadlines pile up meanwhile.
    tokio::time::sleep(Duration::from_secs(10)).await;
    signal(watchdog, libc::SIGCONT);
    // Asleep again (in its wait on the pipe) only once it has taken in what was queued
    // and looked at the deadline; or gone, if it killed the command and fencelock, done
    // with it, ended it.
    tokio::time::timeout(Duration::from_secs(10), async {
        while state(watchdog).is_some_and(|state| state != 'S') {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the watchdog waits again");

    // (A command already killed has closed its end: the write may fail.)
    let mut stdin = fencelock.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"go\n").await;
    let output = tokio::time::timeout(Duration::from_secs(20), fencelock.wait_with_output())
        .await
        .expect("fencelock exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the command ran to its end with the lock held: {stderr}"
    );
    assert!(!stderr.contains("without word from fencelock"), "{stderr}");
}
