//! The signals of `fencelock run`: what it undoes of its parent's settings, and what it
//! forwards to the command.
//!
//! A parent passes three things on through `exec`: ignored signals, `SA_NOCLDWAIT`, and
//! the *mask* of blocked signals. Each is handled on purpose:
//!
//! - SIGCHLD ignored (a Python daemon, some supervisors): reset, or the kernel would reap
//!   the command behind fencelock's back ([`reset_inherited`]).
//! - A blocked mask (a parent that blocked SIGTERM around its `fork`, and exec'd without
//!   restoring it): cleared on this thread, which is the runtime's main thread and lives
//!   as long as the process; the kernel hands a process-directed signal to a thread that
//!   does not block it, so SIGTERM reaches fencelock's handler and is forwarded instead of
//!   staying pending for ever. The command's mask is cleared too, between fork and exec
//!   (`child.rs`): the standard library leaves it as the forking thread's, and a command
//!   that blocks SIGTERM could not be stopped but by SIGKILL.
//! - A forwarded signal that was ignored when fencelock started (`nohup`'s SIGHUP, the
//!   SIGINT of a background job in a script) is neither caught nor forwarded: fencelock
//!   and its command ignore it, as the parent meant ([`Forwarded`]). SIGTERM still reaches
//!   the command when fencelock itself sends it (`child.rs` resets it to its default
//!   between fork and exec).

use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::diag::diag;

/// Undoes what of the parent's signal settings would break the supervision: a SIGCHLD
/// disposition (ignored, or `SA_NOCLDWAIT`: the kernel would reap the command the moment
/// it exits, losing its status and freeing its pid, the group id every later signal goes
/// to, for reuse), and the mask of blocked signals of the calling thread (call it on the
/// thread that runs the runtime's `block_on`). Also ignores SIGTTOU: a background
/// fencelock on a terminal with `stty tostop` would be stopped by its own diagnostic line,
/// with SIGKILL still due by the lease deadline.
pub(super) fn reset_inherited() -> io::Result<()> {
    // SAFETY: an all-zero sigaction and an emptied sigset are valid values; SIG_DFL with
    // no flags is the disposition a process starts with when nobody changed it.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        action.sa_sigaction = libc::SIG_IGN;
        if libc::sigaction(libc::SIGTTOU, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let cleared = libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if cleared != 0 {
            return Err(io::Error::from_raw_os_error(cleared));
        }
    }
    Ok(())
}

/// Whether `signal`'s disposition is "ignore" (inherited through `exec`).
fn ignored(signal: libc::c_int) -> io::Result<bool> {
    // SAFETY: sigaction(2) with no new action only reads the current one into `current`.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(current.sa_sigaction == libc::SIG_IGN)
    }
}

/// A handler for `signal`, unless it was ignored when fencelock started: then it stays
/// ignored (installing a handler would undo that, for fencelock and, through the
/// forwarding, for the command).
fn caught(signal_number: libc::c_int) -> io::Result<Option<Signal>> {
    if ignored(signal_number)? {
        return Ok(None);
    }
    signal(SignalKind::from_raw(signal_number)).map(Some)
}

/// SIGINT, SIGTERM and SIGHUP received by fencelock, for the command's processes, and the
/// other signals whose default action would end fencelock: SIGQUIT (Ctrl-\ at a
/// terminal reaches fencelock's group alone), SIGUSR1 and SIGUSR2 (a log tool's). Killed
/// by one of these, fencelock would leave the command's descendants that left its group
/// running on past the lease (the watchdog kills the group only); forwarded, the command
/// gets it as if it had been sent to the command, and fencelock ends the rest and
/// releases the lock as after any end of the command. And the terminal's stop signal,
/// refused. Each only if it was not ignored at the start.
pub(super) struct Forwarded {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
    hangup: Option<Signal>,
    quit: Option<Signal>,
    user1: Option<Signal>,
    user2: Option<Signal>,
    /// SIGTSTP (Ctrl-Z): a stopped fencelock renews nothing while the command, in a group
    /// of its own that the terminal does not stop, runs on past the lease. Caught, so
    /// that fencelock refuses to be stopped while the command runs.
    stop: Option<Signal>,
}

impl Forwarded {
    /// Installs the handlers (before the command starts: a signal that comes the moment
    /// it runs is caught and forwarded, never acted on by fencelock itself).
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            interrupt: caught(libc::SIGINT)?,
            terminate: caught(libc::SIGTERM)?,
            hangup: caught(libc::SIGHUP)?,
            quit: caught(libc::SIGQUIT)?,
            user1: caught(libc::SIGUSR1)?,
            user2: caught(libc::SIGUSR2)?,
            stop: caught(libc::SIGTSTP)?,
        })
    }

    /// The next signal to forward.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives meanwhile is kept for the next call.
    pub(super) async fn next(&mut self) -> i32 {
        loop {
            tokio::select! {
                () = received(&mut self.interrupt) => return libc::SIGINT,
                () = received(&mut self.terminate) => return libc::SIGTERM,
                () = received(&mut self.hangup) => return libc::SIGHUP,
                () = received(&mut self.quit) => return libc::SIGQUIT,
                () = received(&mut self.user1) => return libc::SIGUSR1,
                () = received(&mut self.user2) => return libc::SIGUSR2,
                () = received(&mut self.stop) => diag!(
                    "not stopping while the command holds the lock (a stopped fencelock \
                     renews nothing); Ctrl-C interrupts the command"
                ),
            }
        }
    }
}

impl Drop for Forwarded {
    /// Once the command is gone, the signals caught for it end fencelock again, as they
    /// do a process that catches nothing: a Ctrl-C or a SIGTERM while it releases the
    /// lock (up to the TTL when the lock service does not answer) must not be swallowed.
    /// tokio keeps its handlers installed for the process's life: they are replaced here.
    /// (Only those caught: a signal ignored at the start stays ignored. SIGTSTP stays
    /// caught, and unanswered: a fencelock stopped during its release would let the lease
    /// run out and report a finished command as lost. A signal that came in while the
    /// command ran and was not forwarded, such as a SIGTERM sent to fencelock and its
    /// command together that the command's end overtook, is not raised again: it was
    /// meant for the command, and would otherwise kill fencelock before its release.
    /// `run` makes one `Forwarded` per process: tokio would not install a handler for
    /// these again.)
    fn drop(&mut self) {
        let caught = [
            (libc::SIGINT, self.interrupt.is_some()),
            (libc::SIGTERM, self.terminate.is_some()),
            (libc::SIGHUP, self.hangup.is_some()),
            (libc::SIGQUIT, self.quit.is_some()),
            (libc::SIGUSR1, self.user1.is_some()),
            (libc::SIGUSR2, self.user2.is_some()),
        ];
        for (number, _) in caught.into_iter().filter(|(_, caught)| *caught) {
            // SAFETY: SIG_DFL installs no handler; the disposition a process starts with.
            unsafe {
                libc::signal(number, libc::SIG_DFL);
            }
        }
    }
}

/// Resolves when `signal` is received; never if it is not caught.
async fn received(signal: &mut Option<Signal>) {
    match signal {
        Some(signal) => {
            if signal.recv().await.is_none() {
                // The runtime's signal driver is gone: nothing more will come.
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
