//! `fencelock run`: run a command while holding a lock, for jobs that must run on one
//! instance at a time (cron on many hosts), or a semaphore permit (`--permits N`).
//!
//! The command gets the fencing token in `FENCELOCK_TOKEN` and the key in
//! `FENCELOCK_KEY`, so that it can fence its own writes. On etcd (the default) the token
//! is the lock key's create revision: it never repeats. `--backend redis` and
//! `--backend redlock` hold the same lock on Redis, under the same rules below; their
//! token is a counter that a Redis failover can repeat (Redlock's is not a fencing token
//! at all), which is what the comparison with etcd is about. `--backend zookeeper` holds
//! Curator's lock recipe on a ZooKeeper ensemble; its token is the lock node's czxid,
//! which never repeats either, and its lease is the session timeout the server grants.
//!
//! # The guarantee
//!
//! The command, and every process it started (its process group, and every descendant
//! that left the group: `fencelock` is their subreaper, `tree.rs`), has received SIGKILL
//! no later than the lock's local lease deadline: the moment the last *confirmed* renewal was sent,
//! plus the TTL, which is no later than the earliest moment the server can give the lock
//! to someone else. When renewals stop being confirmed, SIGTERM goes out `--grace` before
//! that deadline (if renewals resume in time, the command keeps running: the lock is still
//! held). If the server reports the lease gone, SIGKILL goes out at once. If `fencelock`
//! itself dies, a watchdog process kills the group at once; if `fencelock` is stopped
//! (SIGSTOP, a debugger) or its supervision blocked at the deadline, the watchdog kills
//! the group by then too, from the last deadline `fencelock` told it. The lock is released only
//! after all of them are gone: processes the command leaves behind get SIGTERM, then
//! SIGKILL after `--grace`.
//!
//! Its limits: a machine that stops, or a suspended one, cannot signal anyone (the
//! watchdog kills at the resumption), nor can a frozen cgroup (`docker pause`), which
//! freezes the watchdog too; a process of another user (after `sudo`) cannot be
//! signalled (a warning says so, and the lock is held until it exits); and if
//! `fencelock` itself dies or is stopped, the watchdog kills the command's process group
//! only, not the descendants that left it. That is what `FENCELOCK_TOKEN` is for:
//! storage that checks it refuses a holder that outlived its lock.
//!
//! Exit status: the command's own when it ran to completion with the lock held (128 +
//! signal if a signal ended it); 75 when the lock could not be taken within `--wait` (or
//! its lease ran out before the command could start); 76 when the lock was lost while the
//! command ran, or the command ended after the watchdog's deadline (even if releasing the
//! lock then failed); 143
//! when the command exited 0 after fencelock had sent it SIGTERM (renewals were not being
//! confirmed), since an interrupted job is no success; 126
//! when the command cannot be run, 127 when it does not exist (the lock is released at
//! once, or never taken); 2 for invalid arguments; 70 when fencelock itself failed.

mod child;
mod diag;
mod held;
mod signals;
mod tree;
mod watchdog;
mod watchdog_process;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use fencelock::etcd::EtcdGuard;
use fencelock::etcd::EtcdLocker;
use fencelock::redis::{RedisGuard, RedisLocker, RedlockLocker};
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, ReleaseOutcome};

use crate::bench::parse_duration;
use child::{check_program, start_failure_status};
use diag::diag;
use held::{Ending, Held};

pub use watchdog_process::run as watchdog;

/// Options of `fencelock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    metrics: crate::metrics_listen::MetricsListen,
    /// The lock to hold while the command runs: 1 to 128 characters from A-Z a-z 0-9 and
    /// - _ . : @ = (no '/').
    ///
    /// Given more than once, every lock is taken together, without deadlock whatever the
    /// order (etcd, ZooKeeper: one transaction and one token; Redis, Redlock: all or none
    /// in one script, a token per lock); the command gets each lock's token in
    /// `FENCELOCK_TOKENS` (`a=T1,b=T2`) and the smallest in `FENCELOCK_TOKEN`.
    #[arg(long = "lock", required = true)]
    locks: Vec<String>,
    /// The lock's name, or the names joined by ',' (set from `locks`).
    #[arg(skip)]
    lock: String,
    /// Take one of N permits of a semaphore instead of the lock (N instances at once; at
    /// least 1).
    #[arg(long)]
    permits: Option<usize>,
    /// Lease TTL: how long the lock outlives this process if it dies; at most 24h, at
    /// least 1s on etcd (whole seconds there: 1.5s becomes 2s), 100ms on Redis. On
    /// ZooKeeper the session timeout asked for: the server grants one between its
    /// minSessionTimeout and maxSessionTimeout (4s and 40s by default), which is then
    /// the lease (a warning says so when it differs).
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    ttl: Duration,
    /// How long to wait for the lock (default: forever). Durations, here and in --ttl and
    /// --grace, take humantime's forms (250ms, 10s, 1m30s, 2h, "1h 15min"); a bare number
    /// is seconds.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when renewals stop being confirmed (SIGKILL comes
    /// no later than the lease deadline), and for processes the command leaves behind.
    /// Default: a quarter of --ttl, at most 5s; at most half of --ttl (on ZooKeeper a
    /// sixth and a third of the granted session timeout, checked once connected: a
    /// healthy lock's time left swings down to half of it there, not to two thirds).
    /// Renewals go out
    /// every third of --ttl; one that fails or gets no answer within a ninth of --ttl
    /// (250ms to 1s) is retried (on etcd at once, then) after 100ms, 200ms, ... (at most
    /// that ninth), on etcd, Redis and Redlock alike:
    /// with the defaults at least three renewal attempts fail before SIGTERM, however
    /// long each hangs.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Option<Duration>,
    /// Which lock service holds the lock. Only etcd's token never repeats: Redis's can
    /// after a failover, Redlock's is not a fencing token at all.
    #[arg(long, value_enum, default_value_t = RunBackend::Etcd, env = "FENCELOCK_BACKEND")]
    backend: RunBackend,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
    /// A label recorded with the holder (a job id, a URL; at most 256 bytes): `fencelock
    /// locks` shows it beside the host, pid, command and since when. The command's name
    /// is recorded as the holder's program.
    #[arg(long, env = "FENCELOCK_LABEL")]
    label: Option<String>,
    /// Record nothing about the holder (host, pid, command, label) with the lock.
    #[arg(long)]
    no_holder_info: bool,
    /// The independent Redis masters, for --backend redlock (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        env = "FENCELOCK_REDLOCK",
        hide_env_values = true
    )]
    redlock: Vec<String>,
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
/// The command exited 0 after fencelock had sent it SIGTERM because renewals stopped
/// being confirmed: 128 + SIGTERM, what a shell reports for a command SIGTERM ended.
pub const EXIT_INTERRUPTED: u8 = 143;

/// Which lock service holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RunBackend {
    /// etcd: the fencing token is the key's create revision.
    Etcd,
    /// One Redis server (or a master with replicas): the token is a counter that can
    /// repeat after a failover.
    Redis,
    /// Redlock over several Redis masters (`--redis URL,URL,URL`).
    Redlock,
    /// A ZooKeeper ensemble (`--zookeeper host:port,...`): the token is the lock node's
    /// czxid, which never repeats; the TTL is the session timeout asked for.
    Zookeeper,
}

/// How long before the lease deadline SIGKILL goes out: covers this process's own timer
/// and scheduling delay, so that the signal is delivered before the deadline.
fn kill_margin(ttl: Duration) -> Duration {
    Duration::from_millis(20) + ttl / 100
}

/// The longest the supervisor sleeps before it looks at the lease deadline again (it
/// moves with every confirmed renewal).
pub(super) const CHECK: Duration = Duration::from_millis(100);

/// How often the group is looked at for processes left behind: no event tells us when a
/// process that is not our child exits.
pub(super) const GROUP_POLL: Duration = Duration::from_millis(20);

pub async fn run(mut args: RunArgs) -> ExitCode {
    args.lock = args.locks.join(",");
    let code = match run_inner(args).await {
        Ok(code) => code,
        Err(Failure { message, code }) => {
            diag!("{message}");
            code
        }
    };
    // The lock is released by now: a stderr nobody reads costs only this long.
    diag::flush(Duration::from_secs(1));
    ExitCode::from(code)
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

    fn usage(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            code: EXIT_USAGE,
        }
    }

    fn from_lock_error(err: LockError) -> Self {
        Self {
            // A name another client's recipe holds is the caller's to change, as a bad
            // name is: retrying does not help.
            code: if err.is_invalid_input() || err.is_incompatible_recipe() {
                EXIT_USAGE
            } else {
                EXIT_INTERNAL
            },
            message: err.to_string(),
        }
    }
}

async fn run_inner(args: RunArgs) -> Result<u8, Failure> {
    // ZooKeeper's lease is the session timeout the server grants: its grace is sized
    // once that is known (`on_zookeeper`).
    let renewed_grace = match args.backend {
        RunBackend::Zookeeper => None,
        _ => Some(grace(args.grace, Lease::renewed(args.ttl))?),
    };
    signals::reset_inherited()
        .map_err(|err| Failure::internal(format!("cannot reset inherited signals: {err}")))?;
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
    // Before the lock too: without the kernel's lists of children, nothing the command
    // leaves behind would ever be found, and the lock would be released under it.
    if let Err(err) = tree::check_children_listed() {
        return Err(Failure::internal(err));
    }
    let command_name = std::path::Path::new(program).file_name().map_or_else(
        || program.clone(),
        |name| name.to_string_lossy().into_owned(),
    );
    let mut options = LockOptions::new()
        .with_ttl(args.ttl)
        .with_holder_program(command_name)
        .with_holder_info(!args.no_holder_info);
    if let Some(label) = &args.label {
        options = options.with_holder_label(label.clone());
    }
    if let Some(wait) = args.wait {
        options = options.with_wait_timeout(wait);
    }
    let min_ttl = match args.backend {
        RunBackend::Etcd => fencelock::etcd::MIN_TTL,
        RunBackend::Redis | RunBackend::Redlock => fencelock::redis::MIN_TTL,
        RunBackend::Zookeeper => fencelock::zookeeper::MIN_TTL,
    };
    options
        .validate(min_ttl)
        .map_err(Failure::from_lock_error)?;
    // Everything checkable is checked before connecting: a usage error is one, whether
    // the lock service is reachable or not.
    for name in &args.locks {
        fencelock::validate_name(name).map_err(Failure::from_lock_error)?;
    }
    if args.locks.len() > 1 && args.permits.is_some() {
        return Err(Failure::usage("--permits takes one --lock"));
    }
    if args.permits == Some(0) {
        return Err(Failure::usage(
            "--permits 0: a semaphore needs at least one permit",
        ));
    }
    args.metrics.start().map_err(Failure::internal)?;
    let task = |grace| Task {
        program,
        rest,
        lock: &args.lock,
        grace,
    };
    match (args.backend, renewed_grace) {
        (RunBackend::Zookeeper, _) => on_zookeeper(&args, &options, task).await,
        (_, None) => Err(Failure::internal("no grace for a renewed lease")),
        (RunBackend::Etcd, Some(grace)) => on_etcd(&args, &options, task(grace)).await,
        (RunBackend::Redis, Some(grace)) => on_redis(&args, &options, task(grace)).await,
        (RunBackend::Redlock, Some(grace)) => on_redlock(&args, &options, task(grace)).await,
    }
}

/// The command to run under the lock, and how to treat it.
struct Task<'a> {
    program: &'a str,
    rest: &'a [String],
    lock: &'a str,
    grace: Duration,
}

impl Task<'_> {
    /// Runs the command under `guard` until its whole group is gone; returns what became
    /// of it and the exit status so far. `tokens`: each lock's token (`FENCELOCK_TOKENS`),
    /// when the guard holds several; otherwise the guard's own.
    async fn run_under<G: LockGuard>(
        &self,
        guard: &G,
        key: &str,
        ttl: Duration,
        tokens: Option<String>,
    ) -> (Ran, u8) {
        let tokens = tokens.unwrap_or_else(|| format!("{}={}", self.lock, guard.token()));
        let held = Held {
            guard,
            key,
            tokens,
            grace: self.grace,
            margin: kill_margin(ttl),
        };
        match held.run_command(self.program, self.rest, self.lock).await {
            Ending::Completed(exit) => (Ran::Held, exit.shell_status()),
            Ending::Interrupted(exit) => match exit.shell_status() {
                0 => (Ran::Held, EXIT_INTERRUPTED),
                status => (Ran::Held, status),
            },
            Ending::Failed => (Ran::Held, EXIT_INTERNAL),
            Ending::Lost => (Ran::Lost, EXIT_LOCK_LOST),
            Ending::NotStarted(code) => (Ran::Never, code),
        }
    }

    /// How much of the lease must be left at the grant for the command to start: the
    /// kill margin and the grace, plus what starting takes (the watchdog and the fork).
    fn needed_at_start(&self, ttl: Duration) -> Duration {
        kill_margin(ttl) + self.grace + START_ALLOWANCE
    }
}

/// What starting takes at most, in the lease's time: a lock granted with less than this
/// beyond margin and grace is given back instead of run.
const START_ALLOWANCE: Duration = Duration::from_millis(50);

/// What became of the command under the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ran {
    /// It ran (and its group is gone) with the lock held, as far as fencelock knows.
    Held,
    /// The lock was lost while it ran; its group was killed.
    Lost,
    /// It never started: a lock found lost at the release is no news about it.
    Never,
}

/// Takes the lock with `acquire` until a grant leaves more than `needed` of its lease
/// (retrying within `--wait`): a grant whose answer came late (a TTL shorter than a
/// request's round trip, a slow Redlock round) must never start the command on a lease
/// that is already over or about to be.
async fn take_in_time<G, F, Fut>(
    mut acquire: F,
    options: &LockOptions,
    needed: Duration,
) -> Result<G, Failure>
where
    G: LockGuard,
    F: FnMut(LockOptions) -> Fut,
    Fut: Future<Output = Result<G, LockError>>,
{
    let deadline = options
        .wait_timeout()
        .map(|wait| tokio::time::Instant::now() + wait);
    loop {
        let mut attempt = options.clone();
        if let Some(deadline) = deadline {
            attempt = attempt
                .with_wait_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
        }
        let guard = taken(acquire(attempt).await)?;
        let left = guard.lease_remaining().unwrap_or(Duration::MAX);
        if left > needed {
            return Ok(guard);
        }
        diag!(
            "the lock was granted with only {left:?} of its lease left (its answer came \
             late); giving it back without starting the command"
        );
        if let Err(err) = guard.release().await {
            diag!("giving the lock back failed ({err}); it expires with its lease");
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Err(Failure {
                message: format!(
                    "no grant left {needed:?} of the lease to start the command within --wait"
                ),
                code: EXIT_WAIT_TIMEOUT,
            });
        }
        // Not at once: what made the answer late is likely still there.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The guard, or the reason there is none (75 when `--wait` ran out).
fn taken<G>(taken: Result<G, LockError>) -> Result<G, Failure> {
    taken.map_err(|err| {
        if err.is_wait_timeout() {
            Failure {
                message: err.to_string(),
                code: EXIT_WAIT_TIMEOUT,
            }
        } else {
            Failure::from_lock_error(err)
        }
    })
}

async fn on_etcd(args: &RunArgs, options: &LockOptions, task: Task<'_>) -> Result<u8, Failure> {
    let config = args.service.etcd_config().map_err(Failure::usage)?;
    let locks = EtcdLocker::connect(config)
        .await
        .map_err(Failure::from_lock_error)?;
    let semaphore = match args.permits {
        Some(permits) => Some(
            locks
                .semaphore(&args.lock, permits)
                .map_err(Failure::from_lock_error)?,
        ),
        None => None,
    };
    // etcd leases are whole seconds: the TTL the server grants is the rounded-up one.
    let ttl = Duration::from_secs(
        args.ttl
            .as_millis()
            .div_ceil(1000)
            .try_into()
            .unwrap_or(u64::MAX),
    );
    if args.locks.len() > 1 {
        let guard = take_all_in_time(&locks, args, options, task.needed_at_start(ttl)).await?;
        let ttl = guard.guards().first().map_or(ttl, |g| g.session().ttl());
        let keys: Vec<&str> = guard.guards().iter().map(EtcdGuard::key).collect();
        let keys = keys.join(",");
        let tokens = tokens_env(guard.tokens());
        let code = on_guard(guard, &keys, ttl, task, Some(tokens)).await;
        if let Err(err) = locks.close().await {
            diag!("could not revoke the lease ({err}); it expires by itself");
        }
        return Ok(code);
    }
    let guard = take_in_time(
        |options| {
            let (locks, semaphore) = (&locks, &semaphore);
            async move {
                match semaphore {
                    Some(semaphore) => semaphore.acquire(&options).await,
                    None => locks.lock(&args.lock, &options).await,
                }
            }
        },
        options,
        task.needed_at_start(ttl),
    )
    .await?;
    let ttl = guard.session().ttl();
    let (ran, code) = task.run_under(&guard, guard.key(), ttl, None).await;
    // The group is gone (or was never started): now, and only now, the lock may go.
    let cleanup = async {
        let code = if ran == Ran::Lost {
            // Nothing to release; revoking frees the lock sooner if the server still has
            // it.
            drop(guard);
            code
        } else {
            release(guard, ran, code).await
        };
        if let Err(err) = locks.close().await {
            diag!("could not revoke the lease ({err}); it expires by itself");
        }
        code
    };
    Ok(within_ttl(ttl, cleanup, code).await)
}

async fn on_redis(args: &RunArgs, options: &LockOptions, task: Task<'_>) -> Result<u8, Failure> {
    let config = args.service.redis_config([args.service.redis.clone()]);
    let locks = RedisLocker::connect(config)
        .await
        .map_err(Failure::from_lock_error)?;
    let semaphore = match args.permits {
        Some(permits) => Some(
            locks
                .semaphore(&args.lock, permits)
                .map_err(Failure::from_lock_error)?,
        ),
        None => None,
    };
    if args.locks.len() > 1 {
        let guard = take_all_in_time(&locks, args, options, task.needed_at_start(args.ttl)).await?;
        let keys: Vec<&str> = guard.guards().iter().map(RedisGuard::key).collect();
        let keys = keys.join(",");
        let tokens = tokens_env(guard.tokens());
        return Ok(on_guard(guard, &keys, args.ttl, task, Some(tokens)).await);
    }
    let guard = take_in_time(
        |options| {
            let (locks, semaphore) = (&locks, &semaphore);
            async move {
                match semaphore {
                    Some(semaphore) => semaphore.acquire(&options).await,
                    None => locks.lock(&args.lock, &options).await,
                }
            }
        },
        options,
        task.needed_at_start(args.ttl),
    )
    .await?;
    Ok(on_redis_guard(guard, args.ttl, task).await)
}

async fn on_redlock(args: &RunArgs, options: &LockOptions, task: Task<'_>) -> Result<u8, Failure> {
    if args.permits.is_some() {
        return Err(Failure::usage(
            "--permits: Redlock has no semaphore; use --backend etcd or redis",
        ));
    }
    if args.redlock.is_empty() {
        return Err(Failure::usage(
            "--backend redlock needs its masters: --redlock URL,URL,URL",
        ));
    }
    let config = args.service.redis_config(args.redlock.clone());
    let locks = RedlockLocker::connect(config)
        .await
        .map_err(Failure::from_lock_error)?;
    if args.locks.len() > 1 {
        let guard = take_all_in_time(&locks, args, options, task.needed_at_start(args.ttl)).await?;
        let keys: Vec<&str> = guard.guards().iter().map(RedisGuard::key).collect();
        let keys = keys.join(",");
        let tokens = tokens_env(guard.tokens());
        return Ok(on_guard(guard, &keys, args.ttl, task, Some(tokens)).await);
    }
    let guard = take_in_time(
        |options| {
            let locks = &locks;
            async move { locks.lock(&args.lock, &options).await }
        },
        options,
        task.needed_at_start(args.ttl),
    )
    .await?;
    Ok(on_redis_guard(guard, args.ttl, task).await)
}

/// On ZooKeeper the lease is the session timeout the server grants, which may differ
/// from `--ttl` (a server clamps it into its `minSessionTimeout`..`maxSessionTimeout`),
/// and a healthy lock's time left swings down to half of it: the grace, its ceiling and
/// the start check are sized by the granted timeout, known before the lock is taken.
async fn on_zookeeper<'a>(
    args: &RunArgs,
    options: &LockOptions,
    task: impl FnOnce(Duration) -> Task<'a>,
) -> Result<u8, Failure> {
    if args.permits.is_some() {
        return Err(Failure::usage(
            "--permits: the ZooKeeper backend has no semaphore; use --backend etcd or redis",
        ));
    }
    let locks = ZooKeeperLocker::connect(args.service.zookeeper_config())
        .await
        .map_err(Failure::from_lock_error)?;
    let granted = locks
        .session_timeout(options)
        .await
        .map_err(Failure::from_lock_error)?;
    if granted != args.ttl {
        diag!(
            "warning: the ZooKeeper server granted a session timeout of {granted:?}, not \
             --ttl {:?} (it keeps timeouts within its minSessionTimeout and \
             maxSessionTimeout): the lock outlives a dead fencelock by {granted:?}, and the \
             command is timed by it",
            args.ttl
        );
    }
    let task = task(grace(args.grace, Lease::zookeeper(granted))?);
    if args.locks.len() > 1 {
        return on_zookeeper_all(&locks, args, options, granted, task).await;
    }
    let guard = take_in_time(
        |options| {
            let locks = &locks;
            async move { locks.lock(&args.lock, &options).await }
        },
        options,
        task.needed_at_start(granted),
    )
    .await?;
    // The lease is the session timeout the server granted, which may differ from --ttl.
    let ttl = guard.session_timeout();
    let path = guard.path().to_owned();
    let (ran, code) = task.run_under(&guard, &path, ttl, None).await;
    if ran == Ran::Lost {
        // Its session is gone or its node was deleted: nothing to release.
        drop(guard);
        return Ok(code);
    }
    Ok(within_ttl(ttl, release(guard, ran, code), code).await)
}

/// Runs the command under every lock of `--lock` taken together, then releases them.
async fn on_zookeeper_all(
    locks: &ZooKeeperLocker,
    args: &RunArgs,
    options: &LockOptions,
    granted: Duration,
    task: Task<'_>,
) -> Result<u8, Failure> {
    let names: Vec<&str> = args.locks.iter().map(String::as_str).collect();
    let guard = take_in_time(
        |options| {
            let names = &names;
            async move { locks.lock_all(names, &options).await }
        },
        options,
        task.needed_at_start(granted),
    )
    .await?;
    let ttl = guard.guards().first().map_or(
        granted,
        fencelock::zookeeper::ZooKeeperGuard::session_timeout,
    );
    let paths: Vec<&str> = guard.guards().iter().map(|g| g.path()).collect();
    let key = paths.join(",");
    let tokens = tokens_env(guard.tokens());
    let (ran, code) = task.run_under(&guard, &key, ttl, Some(tokens)).await;
    if ran == Ran::Lost {
        drop(guard);
        return Ok(code);
    }
    Ok(within_ttl(ttl, release(guard, ran, code), code).await)
}

/// Runs the command under a Redis (or Redlock) lock, then releases it.
async fn on_redis_guard(guard: RedisGuard, ttl: Duration, task: Task<'_>) -> u8 {
    let key = guard.key().to_owned();
    on_guard(guard, &key, ttl, task, None).await
}

/// `FENCELOCK_TOKENS`: `name=token` for each lock, joined by commas.
fn tokens_env(tokens: Vec<(&str, fencelock::FencingToken)>) -> String {
    let each: Vec<String> = tokens
        .into_iter()
        .map(|(name, token)| format!("{name}={token}"))
        .collect();
    each.join(",")
}

/// Runs the command under `guard` (its key or keys `key`), then releases it.
async fn on_guard<G: LockGuard>(
    guard: G,
    key: &str,
    ttl: Duration,
    task: Task<'_>,
    tokens: Option<String>,
) -> u8 {
    let (ran, code) = task.run_under(&guard, key, ttl, tokens).await;
    if ran == Ran::Lost {
        // Its key has expired or belongs to someone else: nothing to release.
        drop(guard);
        return code;
    }
    within_ttl(ttl, release(guard, ran, code), code).await
}

/// Every lock of `--lock` on `locks`, taken together (`fencelock::lock_all`: one
/// transaction on etcd, all or none in one script on Redis and Redlock), in time to start
/// the command.
async fn take_all_in_time<B: LockBackend>(
    locks: &B,
    args: &RunArgs,
    options: &LockOptions,
    needed: Duration,
) -> Result<fencelock::MultiGuard<B::Guard>, Failure> {
    let names: Vec<&str> = args.locks.iter().map(String::as_str).collect();
    take_in_time(
        |options| {
            let names = &names;
            async move { fencelock::lock_all(locks, names, &options).await }
        },
        options,
        needed,
    )
    .await
}

/// `cleanup`'s exit status, or `code` if it takes longer than `ttl`: by then the lock has
/// expired by itself anyway.
async fn within_ttl(ttl: Duration, cleanup: impl Future<Output = u8>, code: u8) -> u8 {
    match tokio::time::timeout(ttl, cleanup).await {
        Ok(code) => code,
        Err(_) => {
            diag!(
                "warning: the lock service did not confirm the release within {ttl:?}; the \
                 lock expires by itself"
            );
            code
        }
    }
}

/// Releases the lock once the command's group is gone. A failure here never hides what
/// happened to the command: `code` stands, unless the release finds that the lock had
/// been lost while the command ran (then 76: never for a command that did not start),
/// and the failure is reported on stderr.
async fn release<G: LockGuard>(guard: G, ran: Ran, code: u8) -> u8 {
    match guard.release().await {
        Ok(ReleaseOutcome::Released) => code,
        Ok(ReleaseOutcome::Unconfirmed) => {
            diag!(
                "warning: the lock's key is gone, but whether the release removed it or \
                 someone else did first is not known (the release's first attempt got no \
                 answer)"
            );
            code
        }
        Ok(ReleaseOutcome::NotHeld) if ran == Ran::Never => {
            diag!("the lock was found lost when it was given back; the command never ran");
            code
        }
        Ok(ReleaseOutcome::NotHeld) => {
            diag!("the lock was found lost when the command ended; it may have run without it");
            EXIT_LOCK_LOST
        }
        Err(err) => {
            diag!(
                "warning: the command finished with the lock held, but releasing it failed \
                 ({err}); it expires with its lease"
            );
            code
        }
    }
}

/// How a healthy lock's time left moves, which sizes `--grace` and the start check.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Lease {
    /// How long the lock outlives a holder that went silent.
    length: Duration,
    /// The least time left of a lock whose renewals are on schedule.
    floor: Duration,
    /// What the length is, for messages.
    what: &'static str,
    /// What part of the length the grace ceiling is, for messages.
    ceiling_is: &'static str,
}

impl Lease {
    /// An etcd, Redis or Redlock lock renewed every third of `ttl`: its time left
    /// swings between the whole TTL and two thirds of it.
    fn renewed(ttl: Duration) -> Self {
        Self {
            length: ttl,
            floor: ttl * 2 / 3,
            what: "--ttl",
            ceiling_is: "half",
        }
    }

    /// A ZooKeeper lock in a session the server granted `timeout`: its time left swings
    /// between 0.6 and 0.5 of it (`fencelock::zookeeper::healthy_lease_floor`).
    fn zookeeper(timeout: Duration) -> Self {
        Self {
            length: timeout,
            floor: fencelock::zookeeper::healthy_lease_floor(timeout),
            what: "the granted session timeout",
            ceiling_is: "a third",
        }
    }

    /// The most `--grace` may be: a sixth of the lease short of the floor, so that
    /// SIGTERM never goes out while renewals are on schedule (etcd: half the TTL).
    fn grace_ceiling(self) -> Duration {
        self.floor.saturating_sub(self.length / 6)
    }

    /// `--grace` by default: half the ceiling, at most 5 s. On etcd a quarter of the
    /// TTL: SIGTERM 0.74 TTL after the last confirmed renewal, which leaves the renewal
    /// due at a third of the TTL 0.4 TTL for its retries (issue 21).
    fn default_grace(self) -> Duration {
        (self.grace_ceiling() / 2).min(Duration::from_secs(5))
    }
}

/// `--grace`, defaulted and checked against the lease.
fn grace(requested: Option<Duration>, lease: Lease) -> Result<Duration, Failure> {
    let ceiling = lease.grace_ceiling();
    match requested {
        None => Ok(lease.default_grace()),
        Some(grace) if grace <= ceiling => Ok(grace),
        Some(grace) => Err(Failure::usage(format!(
            "--grace {grace:?} is more than {} of {} {:?} ({ceiling:?}): SIGTERM would go \
             out while renewals are still on schedule",
            lease.ceiling_is, lease.what, lease.length
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_is_sized_by_how_low_a_healthy_lease_goes() {
        let etcd = Lease::renewed(Duration::from_secs(12));
        assert_eq!(etcd.grace_ceiling(), Duration::from_secs(6));
        assert_eq!(etcd.default_grace(), Duration::from_secs(3));
        assert_eq!(
            Lease::renewed(Duration::from_secs(60)).default_grace(),
            Duration::from_secs(5)
        );
        // ZooKeeper: the time left swings down to half the granted timeout.
        let zookeeper = Lease::zookeeper(Duration::from_secs(12));
        assert_eq!(zookeeper.grace_ceiling(), Duration::from_secs(4));
        assert_eq!(zookeeper.default_grace(), Duration::from_secs(2));
        assert!(
            grace(
                Some(Duration::from_secs(25)),
                Lease::zookeeper(Duration::from_secs(40))
            )
            .is_err()
        );
        assert!(
            grace(
                Some(Duration::from_secs(25)),
                Lease::renewed(Duration::from_secs(60))
            )
            .is_ok()
        );
    }
}
