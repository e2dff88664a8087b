//! A held lock and the command under it: started under the watchdog, supervised until
//! every process of it is gone, killed before the lease's deadline. Backend-neutral:
//! it asks the guard only for its token, its loss and its lease's remaining time.

use std::time::Duration;

use fencelock::LockGuard;
use futures_util::FutureExt;

use super::child::{Exit, Job, start_failure_status};
use super::diag::diag;
use super::signals::Forwarded;
use super::watchdog::{BootTime, Watchdog};
use super::{CHECK, EXIT_INTERNAL, EXIT_WAIT_TIMEOUT, GROUP_POLL};

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
    /// fencelock lost track of it (waiting for it failed): the whole group was killed and
    /// is gone; exit with [`EXIT_INTERNAL`].
    Failed,
}

/// A held lock and the rules for the command under it.
pub(super) struct Held<'a, G> {
    pub(super) guard: &'a G,
    /// What `FENCELOCK_KEY` tells the command: the lock's key.
    pub(super) key: &'a str,
    /// What `FENCELOCK_TOKENS` tells the command: `name=token` for each lock.
    pub(super) tokens: String,
    pub(super) grace: Duration,
    pub(super) margin: Duration,
}

impl<G: LockGuard> Held<'_, G> {
    /// Starts the command under the watchdog and supervises it until every process of it
    /// is gone.
    pub(super) async fn run_command(&self, program: &str, rest: &[String], lock: &str) -> Ending {
        // Before the command starts: a Ctrl-Z or a SIGTERM that comes the moment it runs
        // is caught (and forwarded), never acted on by fencelock itself.
        let mut signals = match Forwarded::new() {
            Ok(signals) => signals,
            Err(err) => {
                diag!("cannot catch signals: {err}");
                return Ending::NotStarted(EXIT_INTERNAL);
            }
        };
        let mut watchdog = match Watchdog::start() {
            Ok(watchdog) => watchdog,
            Err(err) => {
                diag!("cannot start the watchdog: {err}");
                return Ending::NotStarted(EXIT_INTERNAL);
            }
        };
        // The watchdog is a child of ours: if the kernel's lists of children do not show
        // it, they would not show what the command leaves behind either.
        if !super::tree::lists_child(watchdog.pid()) {
            diag!(
                "this process's children are not listed in /proc/<pid>/task/<tid>/children \
                 (the watchdog is missing there): the command's processes could not be \
                 found; not starting it"
            );
            return Ending::NotStarted(EXIT_INTERNAL);
        }
        let mut command = std::process::Command::new(program);
        command
            .args(rest)
            .env("FENCELOCK_TOKEN", self.guard.token().to_string())
            .env("FENCELOCK_KEY", self.key)
            .env("FENCELOCK_LOCK", lock)
            .env("FENCELOCK_TOKENS", &self.tokens);
        // The deadline before the command: a fencelock stopped the moment it started it
        // leaves a watchdog that knows when to kill it.
        if let Some(at) = self.watchdog_deadline() {
            watchdog.kill_at(at);
        }
        // The grant left time to start (`take_in_time`), but fencelock may have stalled
        // since: a command started now would race the watchdog's kill beside the next
        // holder.
        if self.vouched_for_no_more() {
            diag!(
                "the lease ran out before the command could start (was fencelock stopped?); \
                 not starting it"
            );
            watchdog.finish();
            return Ending::NotStarted(EXIT_WAIT_TIMEOUT);
        }
        let Some(pipe) = watchdog.pipe_fd() else {
            diag!("the watchdog's pipe is closed");
            return Ending::NotStarted(EXIT_INTERNAL);
        };
        let job = match Job::start(command, pipe, watchdog.pid()) {
            Ok(job) => job,
            Err(err) => {
                let status = start_failure_status(&err);
                if status == EXIT_INTERNAL {
                    diag!("could not set up the supervision of {program:?} before it ran: {err}");
                } else {
                    diag!("cannot start {program:?}: {err}");
                }
                watchdog.finish();
                return Ending::NotStarted(status);
            }
        };
        // From here on the two drop together, the watchdog first, whatever happens.
        let mut watched = Watched { watchdog, job };
        let (job, watchdog) = (&mut watched.job, &mut watched.watchdog);
        let ending = match self.supervise(job, &mut signals, watchdog).await {
            Ok(ending) => ending,
            Err(err) => {
                // The group first, the words after: nothing of the command may outlive
                // what follows (the release of the lock).
                job.signal_all(libc::SIGKILL);
                watchdog.stand_down();
                job.wait_all_gone().await;
                diag!("supervising the command failed ({err}); killed its process group");
                Ending::Failed
            }
        };
        let Watched { watchdog, mut job } = watched;
        watchdog.finish();
        job.reap();
        ending
    }

    /// Waits for the command, forwarding signals, and enforces the lease deadline, first
    /// on the command, then on whatever it left behind.
    async fn supervise(
        &self,
        job: &mut Job,
        signals: &mut Forwarded,
        watchdog: &mut Watchdog,
    ) -> std::io::Result<Ending> {
        let mut enforcer = Enforcer::new(self, watchdog);
        let exit = loop {
            job.reap_orphans();
            let next = enforcer.enforce(job);
            tokio::select! {
                biased;
                exit = job.exited() => break exit?,
                reason = self.guard.lost(), if !enforcer.killed => {
                    enforcer.kill(job);
                    diag!("lock lost ({reason}); killed the command");
                }
                () = tokio::time::sleep(next) => {}
                signal = signals.next() => job.signal_all(signal),
            }
        };
        // The end is seen now, which may be long after it came: fencelock may have been
        // stopped (SIGSTOP, a debugger, a suspended machine) while the command ended and
        // the lease ran out, and the next holder may have been granted the lock since.
        // Only a lease still vouched for now says the command ended under the lock.
        if !enforcer.killed && enforcer.watchdog_deadline_passed() {
            // A renewal confirmed since may vouch for the lease again, but the watchdog
            // acted on the deadline it was last told, and may be what ended the command.
            enforcer.kill(job);
            diag!(
                "the command ended after the deadline the watchdog was last told (was \
                 fencelock stopped?); it may have been killed there, and its group is now"
            );
        }
        if !enforcer.killed && self.vouched_for_no_more() {
            enforcer.kill(job);
            diag!(
                "the command's end was seen only after the lease deadline (was fencelock stopped?); \
                 it may have run without the lock"
            );
        }
        let left = job.running_members();
        // Whether the leftovers found got their SIGTERM (processes first found later,
        // after lists that could not be read, get theirs then, and the grace with it).
        let mut terminated_found = !left.processes.is_empty();
        if !left.is_empty() && !enforcer.killed {
            job.signal_all(libc::SIGTERM);
            diag!(
                "the command left {} process(es) running{}; terminating them before the \
                 lock is released",
                left.processes.len(),
                if left.unlisted.is_some() {
                    ", and some whose children cannot be listed"
                } else {
                    ""
                }
            );
            // The grace starts with a SIGTERM that reached a leftover: while none is
            // listed, no SIGKILL sweep runs (it could find one before its SIGTERM).
            if terminated_found {
                enforcer.leftovers_until = Some(tokio::time::Instant::now() + self.grace);
            }
        }
        loop {
            let members = job.running_members();
            if members.is_empty() {
                break;
            }
            if !terminated_found && !members.processes.is_empty() && !enforcer.killed {
                terminated_found = true;
                job.signal_all(libc::SIGTERM);
                diag!(
                    "found {} process(es) the command left running; terminating them before \
                     the lock is released",
                    members.processes.len()
                );
                enforcer.leftovers_until = Some(tokio::time::Instant::now() + self.grace);
            }
            let next = enforcer.enforce(job).min(GROUP_POLL);
            tokio::select! {
                biased;
                reason = self.guard.lost(), if !enforcer.killed => {
                    enforcer.kill(job);
                    diag!("lock lost ({reason}); killed what is left of the command");
                }
                () = tokio::time::sleep(next) => {}
                signal = signals.next() => job.signal_all(signal),
            }
        }
        // As for the command's end: the last of what it left may have ended while
        // fencelock was stopped, after the lease ran out.
        if !enforcer.killed
            && !left.is_empty()
            && (self.vouched_for_no_more() || enforcer.watchdog_deadline_passed())
        {
            enforcer.killed_already();
            diag!(
                "what the command left behind was seen gone only after the lease deadline \
                 (was fencelock stopped?); it may have run without the lock"
            );
        }
        Ok(if enforcer.killed {
            Ending::Lost
        } else if enforcer.terminated {
            Ending::Interrupted(exit)
        } else {
            Ending::Completed(exit)
        })
    }

    /// The guard no longer vouches for the lock: its lease is within the kill margin of
    /// its end (or past it), or its loss has been reported.
    fn vouched_for_no_more(&self) -> bool {
        let remaining = self.guard.lease_remaining().unwrap_or(Duration::MAX);
        remaining <= self.margin || self.guard.lost().now_or_never().is_some()
    }

    /// When the watchdog is to kill the group by itself: the lease deadline less half the
    /// kill margin. fencelock's own kill comes at the margin, so the watchdog's comes
    /// only when fencelock's did not (stopped, its supervision blocked), still before the
    /// deadline. The clock is read before the lease's remaining time, so the moment is
    /// never later than the deadline. `None` when either cannot be read: the watchdog
    /// then guards against fencelock's death only.
    fn watchdog_deadline(&self) -> Option<BootTime> {
        let now = BootTime::now()?;
        let remaining = self.guard.lease_remaining()?;
        Some(now.after(remaining.saturating_sub(self.margin / 2)))
    }
}

/// The watchdog and the command it guards, in the order they must end: the watchdog
/// first (fields drop in order), then the command is reaped. The group's id is the
/// command's pid, which stays taken until the command is reaped, so the watchdog can
/// never kill a group of that id that is someone else's.
struct Watched {
    watchdog: Watchdog,
    job: Job,
}

/// The lease deadline, enforced on the command's group, by fencelock and, should
/// fencelock not run at that moment, by the watchdog.
struct Enforcer<'a, G> {
    held: &'a Held<'a, G>,
    watchdog: &'a mut Watchdog,
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
    fn new(held: &'a Held<'a, G>, watchdog: &'a mut Watchdog) -> Self {
        Self {
            held,
            watchdog,
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
            job.signal_all(libc::SIGKILL);
            return GROUP_POLL;
        }
        if self.watchdog_deadline_passed() {
            // Before the deadline moves on: a renewal confirmed since fencelock's last
            // look would hide that the watchdog has acted (or is about to) on the old one.
            self.kill(job);
            diag!(
                "fencelock did not run at the deadline it last told the watchdog (was it \
                 stopped?); the command is killed"
            );
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
            self.kill(job);
            diag!("no renewal confirmed before the lease deadline; killed the command");
            return GROUP_POLL;
        }
        // Only when not killing: a deadline already passed, sent first, would have the
        // watchdog kill too and say fencelock did not.
        if let Some(at) = self.held.watchdog_deadline() {
            self.watchdog.kill_at(at);
        }
        if let Some(until) = self.leftovers_until {
            if tokio::time::Instant::now() >= until {
                job.signal_all(libc::SIGKILL);
            }
        }
        let term_at = grace + margin;
        if remaining <= term_at {
            if !self.warned {
                self.warned = true;
                self.terminated = true;
                job.signal_all(libc::SIGTERM);
                diag!(
                    "renewals of the lock are not being confirmed; sent SIGTERM, SIGKILL in \
                     {:?} unless they resume",
                    remaining - margin
                );
            }
        } else if self.warned {
            self.warned = false;
            diag!("renewals confirmed again; the command keeps the lock");
        }
        let until_next = if remaining > term_at {
            remaining - term_at
        } else {
            remaining - margin
        };
        until_next.min(CHECK)
    }

    fn kill(&mut self, job: &Job) {
        job.signal_all(libc::SIGKILL);
        self.killed_already();
    }

    /// The last deadline the watchdog was told has passed: it has killed the group, or is
    /// about to.
    fn watchdog_deadline_passed(&self) -> bool {
        self.watchdog.deadline_passed()
    }

    /// The group is killed (or gone): the watchdog no longer needs a deadline of its own
    /// (it would only kill it again, and say it was fencelock that did not), but for
    /// fencelock's death.
    fn killed_already(&mut self) {
        self.killed = true;
        self.watchdog.stand_down();
    }
}
