//! The watchdog of `fencelock run`: a small process that kills the command's whole
//! process group the moment `fencelock` itself dies, however it dies (SIGKILL, the OOM
//! killer, a crash), or when the lease deadline passes while `fencelock` cannot act on
//! it (stopped by SIGSTOP or a debugger, its supervising thread blocked), so that the
//! command never runs on while the lock expires and another host takes it. (It shares
//! `fencelock`'s cgroup: a frozen cgroup, or one starved of CPU, holds it up as well.)
//!
//! It is this same binary (`/proc/self/exe run-watchdog`, so a binary replaced on disk
//! meanwhile does not matter), in a process group of its own (a Ctrl-C, a hang-up or a
//! SIGSTOP for `fencelock`'s group does not reach it), reading a pipe whose only writers
//! are `fencelock` and, once, the command:
//!
//! - `group <pgid>`: the group to kill (written by the command itself between fork and
//!   exec, so that it is never unguarded);
//! - `kill-at <ns>`: SIGKILL the group at this `CLOCK_BOOTTIME` time; each one replaces
//!   the one before (written by `fencelock` before the command starts and whenever the
//!   lease deadline moved, at its looks);
//! - `stand-down`: `fencelock` killed the group itself; forget the `kill-at`;
//! - end of file: `fencelock` is gone; SIGKILL the group, then exit.
//!
//! When `fencelock` has finished with the group, it kills the watchdog itself (SIGKILL,
//! which no signal disposition stops), before it closes the pipe and before it reaps the
//! command (whose pid is the group's id): nothing of the watchdog is left to read an end
//! of file then, nor to kill a group id that may be someone else's by then. (Telling it
//! `done` and waiting for its exit left `fencelock` waiting forever on a stopped
//! watchdog.)
//!
//! The pipe's writing end is close-on-exec, so the command cannot hold it open; the
//! process itself is in `watchdog_process.rs`.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use super::watchdog_process::ignore_signals;

/// A moment on `CLOCK_BOOTTIME`, in nanoseconds: the clock the watchdog kills by. Unlike
/// `CLOCK_MONOTONIC` (tokio's `Instant`) it goes on while the machine is suspended, as
/// the lock service's own clock does, so a deadline that passed during a suspension is
/// acted on at the resumption, not a suspension later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootTime(u64);

impl BootTime {
    /// Now. `None` if the clock cannot be read (a kernel older than 2.6.39).
    pub fn now() -> Option<Self> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into `now`, which is ours.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut now) } != 0 {
            return None;
        }
        let seconds = u64::try_from(now.tv_sec).ok()?;
        let nanos = u64::try_from(now.tv_nsec).ok()?;
        Some(Self(
            seconds.saturating_mul(1_000_000_000).saturating_add(nanos),
        ))
    }

    /// This moment plus `after` (saturating).
    #[must_use]
    pub fn after(self, after: Duration) -> Self {
        let nanos = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }

    /// How long from this moment until `later` (zero if it is not later).
    pub fn until(self, later: Self) -> Duration {
        Duration::from_nanos(later.0.saturating_sub(self.0))
    }

    /// The nanoseconds, as the pipe carries them.
    pub fn nanos(self) -> u64 {
        self.0
    }

    /// From the pipe's nanoseconds.
    pub fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }
}

/// How far a `kill-at` may move before it is sent again: it moves a little on every look
/// (the moment the lease's remaining time is read at drifts from the clock's), and
/// writing each of those would be a write per look for nothing. A deadline moved earlier
/// by less than this is covered by the watchdog's place in the kill margin (`held.rs`).
const RESEND: Duration = Duration::from_millis(1);

/// The `fencelock` side: tells the watchdog by when to kill the group (which the
/// command announces itself), and ends it when done.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    /// Non-blocking: a watchdog that stopped reading (stopped itself) never blocks
    /// `fencelock`.
    pipe: Option<ChildStdin>,
    /// The last `kill-at` the watchdog was sent.
    kill_at: Option<BootTime>,
    /// A `kill-at` was replaced only after it had passed: the watchdog may have acted on
    /// it before it read the next one.
    overtaken: bool,
}

impl Watchdog {
    /// Starts the watchdog process. It ignores the signals in
    /// `watchdog_process::IGNORED` from its first instruction on: they are set to
    /// `SIG_IGN` between fork and exec (an ignored signal stays ignored across exec), so no
    /// window exists between exec and the watchdog's own start-up in which a SIGTERM to
    /// every process would end it. (Setting them only in the watchdog's `run` left that
    /// window: the dynamic loader and the argument parser run first, and on a loaded
    /// machine a SIGTERM sent right after `fencelock run` started its command killed the
    /// watchdog.)
    pub fn start() -> io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new("/proc/self/exe");
        command
            .arg("run-watchdog")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and calls only
        // signal(2), which is async-signal-safe; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                ignore_signals();
                Ok(())
            });
        }
        // `spawn` returns once the exec succeeded, so the watchdog ignores them by now.
        let mut child = command.spawn()?;
        let pipe = child.stdin.take();
        if let Some(pipe) = &pipe {
            set_nonblocking(pipe.as_raw_fd())?;
        }
        Ok(Self {
            child,
            pipe,
            kill_at: None,
            overtaken: false,
        })
    }

    /// The watchdog's pid (a child of this process that is not part of the command).
    pub fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.child.id()).unwrap_or(libc::pid_t::MAX)
    }

    /// The writing end of the pipe, for the command to announce its group on before it
    /// execs (`child.rs`); `None` once finished.
    pub fn pipe_fd(&self) -> Option<RawFd> {
        self.pipe.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The watchdog is to kill the group at `at` unless told a later time before. Sent
    /// only when it moved ([`RESEND`]). A watchdog that is not reading (its pipe full)
    /// misses it, and says nothing: it could not act on it anyway.
    pub fn kill_at(&mut self, at: BootTime) {
        let moved = self
            .kill_at
            .is_none_or(|sent| at > sent.after(RESEND) || at.after(RESEND) < sent);
        if moved && self.send(&format!("kill-at {}\n", at.nanos())).is_ok() {
            // Read after the write: a deadline that passed before the new one was in the
            // pipe may have been acted on (fencelock's look came just in time, its write
            // late).
            if let Some(old) = self.kill_at.replace(at) {
                self.overtaken |= passed(old);
            }
        }
    }

    /// A deadline the watchdog was told (and not stood down from) has passed: it has
    /// killed the group, or is about to.
    pub fn deadline_passed(&self) -> bool {
        self.overtaken || self.kill_at.is_some_and(passed)
    }

    /// `fencelock` killed the group itself: the watchdog forgets its `kill-at` (it still
    /// kills the group should `fencelock` die).
    pub fn stand_down(&mut self) {
        if self.send("stand-down\n").is_ok() {
            self.kill_at = None;
        }
    }

    /// `fencelock` is done with the group: kills the watchdog (SIGKILL, before the pipe
    /// closes: see the module's docs) and reaps it. Dropping it does the same.
    pub fn finish(self) {
        drop(self);
    }

    /// One line, in one write: every line is far shorter than `PIPE_BUF`, so the write is
    /// atomic (never interleaved with the command's `group` line, never cut short) and,
    /// the pipe being non-blocking, never waits.
    fn send(&mut self, line: &str) -> io::Result<()> {
        match self.pipe.as_mut() {
            Some(pipe) => {
                let written = pipe.write(line.as_bytes())?;
                if written == line.len() {
                    Ok(())
                } else {
                    Err(io::Error::other("watchdog pipe: short write"))
                }
            }
            None => Err(io::Error::other("watchdog pipe closed")),
        }
    }
}

impl Drop for Watchdog {
    /// Kills and reaps the watchdog before its pipe closes (the fields drop after this),
    /// whatever path fencelock leaves by: an unwinding panic too, which drops the command's
    /// `Job` (and reaps the command) right after: see `held.rs`'s `Watched`.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `at` has passed (or the clock cannot be read: then assume it has).
fn passed(at: BootTime) -> bool {
    BootTime::now().is_none_or(|now| now >= at)
}

/// Sets `O_NONBLOCK` on `fd`. (The command's `group` line goes through the same open
/// pipe, non-blocking too: the pipe is empty then but for one `kill-at`.)
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_arithmetic_saturates() {
        let at = BootTime::from_nanos(5);
        assert_eq!(at.after(Duration::from_nanos(7)).nanos(), 12);
        assert_eq!(at.until(BootTime::from_nanos(12)), Duration::from_nanos(7));
        assert_eq!(at.until(BootTime::from_nanos(1)), Duration::ZERO);
        assert_eq!(at.after(Duration::MAX).nanos(), u64::MAX);
        let now = BootTime::now().expect("CLOCK_BOOTTIME");
        assert!(BootTime::now().expect("CLOCK_BOOTTIME") >= now);
    }
}
