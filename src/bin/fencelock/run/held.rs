//! A held lock and the command under it: started under the watchdog, supervised until
//! its whole process group is gone, killed before the lease's deadline. Backend-neutral:
//! it asks the guard only for its token, its loss and its lease's remaining time.

use std::time::Duration;

use fencelock::LockGuard;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::child::{Exit, Job, start_failure_status};
use super::watchdog::Watchdog;
use super::{CHECK, EXIT_INTERNAL, GROUP_POLL};

/// How the command's time under the lock ended.
pub(super) enum Ending {
    /// The command (and its group) finished with the lock held.
    Completed(Exit),
    /// The command finished with the lock held, after fencelock had sent it SIGTERM
    /// because renewals stopped being confirmed: its own status unless that is success
    /// (a job that handles SIGTERM and exits 0 was still interrupted).
    Interrupted(Exit),
    /// The lock was lost (or could no longer be vouched for) while it ran: the group was
    /// killed.
    Lost,
    /// It could not be started; exit with this status.
    NotStarted(u8),
}

/// A held lock and the rules for the command under it.
pub(super) struct Held<'a, G> {
    pub(super) guard: &'a G,
    /// What `FENCELOCK_KEY` tells the command: the lock's key.
    pub(super) key: &'a str,
    pub(super) grace: Duration,
    pub(super) margin: Duration,
}

impl<G: LockGuard> Held<'_, G> {
    /// Starts the command under the watchdog and supervises it until its whole group is
    /// gone.
    pub(super) async fn run_command(&self, program: &str, rest: &[String], lock: &str) -> Ending {
        let watchdog = match Watchdog::start() {
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
            .env("FENCELOCK_KEY", self.key)
            .env("FENCELOCK_LOCK", lock);
        let Some(pipe) = watchdog.pipe_fd() else {
            eprintln!("fencelock run: the watchdog's pipe is closed");
            return Ending::NotStarted(EXIT_INTERNAL);
        };
        let mut job = match Job::start(command, pipe) {
            Ok(job) => job,
            Err(err) => {
                eprintln!("fencelock run: cannot start {program:?}: {err}");
                watchdog.finish();
                return Ending::NotStarted(start_failure_status(&err));
            }
        };
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
        } else if enforcer.terminated {
            Ending::Interrupted(exit)
        } else {
            Ending::Completed(exit)
        })
    }
}

/// The lease deadline, enforced on the command's group.
struct Enforcer<'a, G> {
    held: &'a Held<'a, G>,
    /// SIGTERM went out because renewals stopped being confirmed (and they have not been
    /// confirmed again since).
    warned: bool,
    /// That SIGTERM ever went out.
    terminated: bool,
    /// SIGKILL went out: the lock is (about to be) gone.
    killed: bool,
    /// When processes left behind by the command get SIGKILL.
    leftovers_until: Option<tokio::time::Instant>,
}

impl<'a, G: LockGuard> Enforcer<'a, G> {
    fn new(held: &'a Held<'a, G>) -> Self {
        Self {
            held,
            warned: false,
            terminated: false,
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
            ..
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
                self.terminated = true;
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
