//! `fencelock run`: run a command while holding a lock, for jobs that must run on one
//! instance at a time (cron on many hosts), or a semaphore permit (`--permits N`).
//!
//! The command gets the fencing token in `FENCELOCK_TOKEN` (the lock key's create
//! revision) and the key in `FENCELOCK_KEY`, so that it can fence its own writes. If the
//! lock is lost while it runs, the command is terminated: SIGTERM to its process group,
//! then SIGKILL after the grace period.
//!
//! Exit status: the command's own when it ran to completion (128 + signal if a signal
//! ended it); 75 when the lock could not be taken within `--wait`; 76 when the lock was
//! lost and the command terminated; 70 when fencelock itself failed (etcd unreachable...).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::{LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use tokio::signal::unix::{SignalKind, signal};

use crate::bench::parse_duration;

/// Options of `fencelock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock to hold while the command runs.
    #[arg(long)]
    lock: String,
    /// Take one of N permits of a semaphore instead of the lock (N instances at once).
    #[arg(long)]
    permits: Option<usize>,
    /// Lease TTL: how long the lock outlives this process if it dies.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long to wait for the lock (default: forever).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// etcd endpoints (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        env = "FENCELOCK_ETCD"
    )]
    etcd: Vec<String>,
    /// Key namespace.
    #[arg(long, default_value = "fencelock")]
    namespace: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub const EXIT_INTERNAL: u8 = 70;
pub const EXIT_WAIT_TIMEOUT: u8 = 75;
pub const EXIT_LOCK_LOST: u8 = 76;

pub async fn run(args: RunArgs) -> ExitCode {
    match run_inner(args).await {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("fencelock run: {err}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

async fn run_inner(args: RunArgs) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let config = EtcdConfig::new(args.etcd.clone()).with_namespace(&args.namespace);
    let locks = EtcdLocker::connect(config).await?;
    let mut options = LockOptions::new().with_ttl(args.ttl);
    if let Some(wait) = args.wait {
        options = options.with_wait_timeout(wait);
    }
    let taken = match args.permits {
        Some(permits) => {
            locks
                .semaphore(&args.lock, permits)?
                .acquire(&options)
                .await
        }
        None => locks.lock(&args.lock, &options).await,
    };
    let guard = match taken {
        Ok(guard) => guard,
        Err(err) if err.is_wait_timeout() => {
            eprintln!("fencelock run: {err}");
            return Ok(EXIT_WAIT_TIMEOUT);
        }
        Err(err) => return Err(err.into()),
    };
    let (program, rest) = args.command.split_first().ok_or("no command given")?;
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .env("FENCELOCK_TOKEN", guard.token().to_string())
        .env("FENCELOCK_KEY", guard.key())
        .env("FENCELOCK_LOCK", &args.lock)
        // Its own process group: signals reach a shell and everything it started.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let group = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or("child has no pid")?;

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let code = loop {
        tokio::select! {
            status = child.wait() => break exit_code(status?),
            reason = guard.lost() => {
                eprintln!("fencelock run: lock {:?} lost ({reason}); terminating the command", args.lock);
                signal_group(group, libc::SIGTERM);
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    signal_group(group, libc::SIGKILL);
                    child.wait().await?;
                }
                break EXIT_LOCK_LOST;
            }
            _ = interrupt.recv() => signal_group(group, libc::SIGINT),
            _ = terminate.recv() => signal_group(group, libc::SIGTERM),
            _ = hangup.recv() => signal_group(group, libc::SIGHUP),
        }
    };
    if code != EXIT_LOCK_LOST && guard.release().await? == ReleaseOutcome::NotHeld {
        eprintln!("fencelock run: the lock was no longer held when the command ended");
    }
    locks.close().await?;
    Ok(code)
}

fn signal_group(group: i32, signal: i32) {
    // SAFETY: kill(2) on the process group of a child we started and have not reaped.
    unsafe {
        libc::kill(-group, signal);
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        _ => 1,
    }
}
