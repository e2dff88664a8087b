//! `fencelock run`: run a command while holding a lock, for jobs that must run on one
//! instance at a time (cron on many hosts), or a semaphore permit (`--permits N`).
//!
//! The command gets the fencing token in `FENCELOCK_TOKEN` (the lock key's create
//! revision) and the key in `FENCELOCK_KEY`, so that it can fence its own writes.
//!
//! # The guarantee
//!
//! The command, and every process in its process group, has received SIGKILL no later
//! than the lock's local lease deadline: the moment the last *confirmed* renewal was sent,
//! plus the TTL, which is no later than the earliest moment the server can give the lock
//! to someone else. When renewals stop being confirmed, SIGTERM goes out `--grace` before
//! that deadline (if renewals resume in time, the command keeps running: the lock is still
//! held). If the server reports the lease gone, SIGKILL goes out at once. If `fencelock`
//! itself dies, a watchdog process kills the group at once. The lock is released only
//! after the whole group is gone: processes the command leaves behind get SIGTERM, then
//! SIGKILL after `--grace`.
//!
//! Its limits: a *paused* `fencelock` (or a machine that stops, or a suspended one)
//! cannot signal anyone, and processes that leave the process group (`setsid`,
//! `setpgid`, a daemon) are out of reach. That is what `FENCELOCK_TOKEN` is for: storage
//! that checks it refuses a holder that outlived its lock.
//!
//! Exit status: the command's own when it ran to completion with the lock held (128 +
//! signal if a signal ended it); 75 when the lock could not be taken within `--wait`; 76
//! when the lock was lost while the command ran (even if releasing it then failed); 126
//! when the command cannot be run, 127 when it does not exist (the lock is released at
//! once, or never taken); 2 for invalid arguments; 70 when fencelock itself failed.

mod child;
mod watchdog;

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fencelock::etcd::{EtcdConfig, EtcdGuard, EtcdLocker};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, ReleaseOutcome};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::bench::parse_duration;
use child::{Exit, Job, check_program, start_failure_status};
use watchdog::Watchdog;

pub use watchdog::run as watchdog;

/// Options of `fencelock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock to hold while the command runs: 1 to 128 characters from A-Z a-z 0-9 and
    /// - _ . : @ = (no '/').
    #[arg(long)]
    lock: String,
    /// Take one of N permits of a semaphore instead of the lock (N instances at once; at
    /// least 1).
    #[arg(long)]
    permits: Option<usize>,
    /// Lease TTL: how long the lock outlives this process if it dies; 1s to 24h (etcd
    /// leases are whole seconds: 1.5s becomes 2s).
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    ttl: Duration,
    /// How long to wait for the lock (default: forever).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when renewals stop being confirmed (SIGKILL comes
    /// no later than the lease deadline), and for processes the command leaves behind.
    /// Default: a third of --ttl, at most 5s; at most half of --ttl.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Option<Duration>,
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
    #[command(flatten)]
    security: crate::security::EtcdSecurity,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Invalid arguments (clap uses the same code for the ones it refuses).
pub const EXIT_USAGE: u8 = 2;
/// fencelock itself failed.
pub const EXIT_INTERNAL: u8 = 70;
/// The lock was not taken within `--wait`.
pub const EXIT_WAIT_TIMEOUT: u8 = 75;
/// The lock was lost while the command ran.
pub const EXIT_LOCK_LOST: u8 = 76;

/// How long before the lease deadline SIGKILL goes out: covers this process's own timer
/// and scheduling delay, so that the signal is delivered before the deadline.
fn kill_margin(ttl: Duration) -> Duration {
    Duration::from_millis(20) + ttl / 100
}

/// The longest the supervisor sleeps before it looks at the lease deadline again (it
/// moves with every confirmed renewal).
const CHECK: Duration = Duration::from_millis(100);

/// How often the group is looked at for processes left behind: no event tells us when a
/// process that is not our child exits.
const GROUP_POLL: Duration = Duration::from_millis(20);

pub async fn run(args: RunArgs) -> ExitCode {
    ExitCode::from(match run_inner(args).await {
        Ok(code) => code,
        Err(Failure { message, code }) => {
            eprintln!("fencelock run: {message}");
            code
        }
    })
}

/// A reason to stop, with the exit status it gets.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn internal(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            code: EXIT_INTERNAL,
        }
    }

    fn from_lock_error(err: LockError) -> Self {
        Self {
            code: if err.is_invalid_input() {
                EXIT_USAGE
            } else {
                EXIT_INTERNAL
            },
            message: err.to_string(),
        }
    }
}

async fn run_inner(args: RunArgs) -> Result<u8, Failure> {
    let grace = grace(&args)?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::internal("no command given"))?;
    // Before the lock: a typo must not cost anyone a turn.
    if let Err(err) = check_program(program) {
        return Err(Failure {
            message: format!("cannot run {program:?}: {err}"),
            code: start_failure_status(&err),
        });
    }
    let mut options = LockOptions::new().with_ttl(args.ttl);
    if let Some(wait) = args.wait {
        options = options.with_wait_timeout(wait);
    }
    options
        .validate(fencelock::etcd::MIN_TTL)
        .map_err(Failure::from_lock_error)?;
    // Everything checkable is checked before connecting: a usage error is one, whether
    // etcd is reachable or not.
    fencelock::validate_name(&args.lock).map_err(Failure::from_lock_error)?;
    if args.permits == Some(0) {
        return Err(Failure {
            message: "--permits 0: a semaphore needs at least one permit".into(),
            code: EXIT_USAGE,
        });
    }
    let config = EtcdConfig::new(args.etcd.clone()).with_namespace(&args.namespace);
    let config = args.security.apply(config).map_err(|message| Failure {
        message,
        code: EXIT_USAGE,
    })?;
    let locks = EtcdLocker::connect(config)
        .await
        .map_err(Failure::from_lock_error)?;
    let taken = match args.permits {
        Some(permits) => match locks.semaphore(&args.lock, permits) {
            Ok(semaphore) => semaphore.acquire(&options).await,
            Err(err) => Err(err),
        },
        None => locks.lock(&args.lock, &options).await,
    };
    let guard = match taken {
        Ok(guard) => guard,
        Err(err) if err.is_wait_timeout() => {
            eprintln!("fencelock run: {err}");
            return Ok(EXIT_WAIT_TIMEOUT);
        }
        Err(err) => return Err(Failure::from_lock_error(err)),
    };

    let held = Held {
        guard: &guard,
        grace,
        margin: kill_margin(guard.session().ttl()),
    };
    let ending = held.run_command(program, rest, &args.lock).await;
    // The group is gone (or was never started): now, and only now, the lock may go.
    let lost = matches!(ending, Ending::Lost);
    let code = match ending {
        Ending::Completed(exit) => exit.shell_status(),
        Ending::Lost => EXIT_LOCK_LOST,
        Ending::NotStarted(code) => code,
    };
    Ok(finish(&locks, guard, lost, code).await)
}

/// `--grace`, defaulted and checked against `--ttl`.
fn grace(args: &RunArgs) -> Result<Duration, Failure> {
    let ceiling = args.ttl / 2;
    match args.grace {
        None => Ok((args.ttl / 3).min(Duration::from_secs(5))),
        Some(grace) if grace <= ceiling => Ok(grace),
        Some(grace) => Err(Failure {
            message: format!(
                "--grace {grace:?} is more than half of --ttl {:?}: SIGTERM would go out \
                 while renewals are still on schedule",
                args.ttl
            ),
            code: EXIT_USAGE,
        }),
    }
}

/// How the command's time under the lock ended.
enum Ending {
    /// The command (and its group) finished with the lock held.
    Completed(Exit),
    /// The lock was lost (or could no longer be vouched for) while it ran: the group was
    /// killed.
    Lost,
    /// It could not be started; exit with this status.
    NotStarted(u8),
}

/// A held lock and the rules for the command under it.
struct Held<'a> {
    guard: &'a EtcdGuard,
    grace: Duration,
    margin: Duration,
}

impl Held<'_> {
    /// Starts the command under the watchdog and supervises it until its whole group is
    /// gone.
    async fn run_command(&self, program: &str, rest: &[String], lock: &str) -> Ending {
        let mut watchdog = match Watchdog::start() {
            Ok(watchdog) => watchdog,
            Err(err) => {
                eprintln!("fencelock run: cannot start the watchdog: {err}");
                return Ending::NotStarted(EXIT_INTERNAL);
            }
        };
        let mut command = std::process::Command::new(program);
        command
            .args(rest)
            .env("FENCELOCK_TOKEN", self.guard.token().to_string())
            .env("FENCELOCK_KEY", self.guard.key())
            .env("FENCELOCK_LOCK", lock);
        let mut job = match Job::start(command) {
            Ok(job) => job,
            Err(err) => {
                eprintln!("fencelock run: cannot start {program:?}: {err}");
                watchdog.finish();
                return Ending::NotStarted(start_failure_status(&err));
            }
        };
        if let Err(err) = watchdog.guard(job.group()) {
            eprintln!("fencelock run: the watchdog is gone ({err}); stopping the command");
            drop(job);
            return Ending::NotStarted(EXIT_INTERNAL);
        }
        let ending = match self.supervise(&mut job).await {
            Ok(ending) => ending,
            Err(err) => {
                eprintln!("fencelock run: supervising the command failed: {err}");
                // Dropping the job kills whatever is left of the group.
                Ending::NotStarted(EXIT_INTERNAL)
            }
        };
        job.reap();
        watchdog.finish();
        ending
    }

    /// Waits for the command, forwarding signals, and enforces the lease deadline, first
    /// on the command, then on whatever it left behind in its group.
    async fn supervise(&self, job: &mut Job) -> std::io::Result<Ending> {
        let mut signals = Forwarded::new()?;
        let mut enforcer = Enforcer::new(self);
        let exit = loop {
            let next = enforcer.enforce(job);
            tokio::select! {
                biased;
                exit = job.exited() => break exit?,
                reason = self.guard.lost(), if !enforcer.killed => {
                    eprintln!("fencelock run: lock lost ({reason}); killing the command");
                    enforcer.kill(job);
                }
                () = tokio::time::sleep(next) => {}
                signal = signals.next() => job.signal_group(signal),
            }
        };
        let left = job.running_members();
        if !left.is_empty() && !enforcer.killed {
            eprintln!(
                "fencelock run: the command left {} process(es) running in its group; \
                 terminating them before the lock is released",
                left.len()
            );
            job.signal_group(libc::SIGTERM);
            enforcer.leftovers_until = Some(tokio::time::Instant::now() + self.grace);
        }
        while !job.running_members().is_empty() {
            let next = enforcer.enforce(job).min(GROUP_POLL);
            tokio::select! {
                biased;
                reason = self.guard.lost(), if !enforcer.killed => {
                    eprintln!("fencelock run: lock lost ({reason}); killing what is left of the command");
                    enforcer.kill(job);
                }
                () = tokio::time::sleep(next) => {}
                signal = signals.next() => job.signal_group(signal),
            }
        }
        Ok(if enforcer.killed {
            Ending::Lost
        } else {
            Ending::Completed(exit)
        })
    }
}

/// The lease deadline, enforced on the command's group.
struct Enforcer<'a> {
    held: &'a Held<'a>,
    /// SIGTERM went out because renewals stopped being confirmed.
    warned: bool,
    /// SIGKILL went out: the lock is (about to be) gone.
    killed: bool,
    /// When processes left behind by the command get SIGKILL.
    leftovers_until: Option<tokio::time::Instant>,
}

impl<'a> Enforcer<'a> {
    fn new(held: &'a Held<'a>) -> Self {
        Self {
            held,
            warned: false,
            killed: false,
            leftovers_until: None,
        }
    }

    /// Signals what the deadline calls for now; returns how long until the next look.
    fn enforce(&mut self, job: &Job) -> Duration {
        if self.killed {
            // Keep at it: a process may have been forking when the signal went out.
            job.signal_group(libc::SIGKILL);
            return GROUP_POLL;
        }
        let Held {
            guard,
            grace,
            margin,
        } = *self.held;
        let remaining = guard.lease_remaining().unwrap_or(Duration::MAX);
        if remaining <= margin {
            eprintln!(
                "fencelock run: no renewal confirmed before the lease deadline; killing the command"
            );
            self.kill(job);
            return GROUP_POLL;
        }
        if let Some(until) = self.leftovers_until {
            if tokio::time::Instant::now() >= until {
                job.signal_group(libc::SIGKILL);
            }
        }
        let term_at = grace + margin;
        if remaining <= term_at {
            if !self.warned {
                self.warned = true;
                eprintln!(
                    "fencelock run: renewals of the lock are not being confirmed; SIGTERM now, \
                     SIGKILL in {:?} unless they resume",
                    remaining - margin
                );
                job.signal_group(libc::SIGTERM);
            }
        } else if self.warned {
            self.warned = false;
            eprintln!("fencelock run: renewals confirmed again; the command keeps the lock");
        }
        let until_next = if remaining > term_at {
            remaining - term_at
        } else {
            remaining - margin
        };
        until_next.min(CHECK)
    }

    fn kill(&mut self, job: &Job) {
        self.killed = true;
        job.signal_group(libc::SIGKILL);
    }
}

/// SIGINT, SIGTERM and SIGHUP received by fencelock, for the command's group.
struct Forwarded {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Forwarded {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal to forward.
    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
        }
    }
}

/// Releases the lock and closes the session once the command's group is gone. A failure
/// here never hides what happened to the command: `code` stands, unless the release finds
/// that the lock had been lost (then 76), and the failure is reported on stderr. It takes
/// at most the TTL: by then the lease has run out by itself anyway.
async fn finish(locks: &EtcdLocker, guard: EtcdGuard, lost: bool, code: u8) -> u8 {
    let budget = guard.session().ttl();
    let cleanup = async {
        let mut code = code;
        if lost {
            // Nothing to release; revoking frees the lock sooner if the server still has
            // it.
            drop(guard);
            if let Err(err) = locks.close().await {
                eprintln!(
                    "fencelock run: could not revoke the lease ({err}); it expires by itself"
                );
            }
            return code;
        }
        match guard.release().await {
            Ok(ReleaseOutcome::Released) => {}
            Ok(ReleaseOutcome::NotHeld) => {
                eprintln!(
                    "fencelock run: the lock was found lost when the command ended; it may \
                     have run without it"
                );
                code = EXIT_LOCK_LOST;
            }
            Err(err) => eprintln!(
                "fencelock run: warning: the command finished with the lock held, but \
                 releasing it failed ({err}); it expires with its lease"
            ),
        }
        if let Err(err) = locks.close().await {
            eprintln!(
                "fencelock run: warning: could not revoke the lease ({err}); it expires by itself"
            );
        }
        code
    };
    match tokio::time::timeout(budget, cleanup).await {
        Ok(code) => code,
        Err(_) => {
            eprintln!(
                "fencelock run: warning: etcd did not confirm the release within {budget:?}; \
                 the lease expires by itself"
            );
            code
        }
    }
}
