//! The watchdog of `fencelock run`: a small process that kills the command's whole
//! process group the moment `fencelock` itself dies, however it dies (SIGKILL, the OOM
//! killer, a crash), so that the command never runs on while the lock expires and
//! another host takes it.
//!
//! It is this same binary (`/proc/self/exe run-watchdog`, so a binary replaced on disk
//! meanwhile does not matter), in a process group of its own (a Ctrl-C or a hang-up for
//! `fencelock` does not reach it), reading a pipe whose only writer is `fencelock`:
//!
//! - `group <pgid>`: the group to kill (written by the command itself between fork and
//!   exec, so that it is never unguarded);
//! - `done`: `fencelock` has finished with the group; exit without killing anything;
//! - end of file without `done`: `fencelock` is gone; SIGKILL the group, then exit.
//!
//! The pipe's writing end is close-on-exec, so the command cannot hold it open.

use std::io::{self, BufRead, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};

/// The `fencelock` side: tells the watchdog which group to guard, and when it is done.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts the watchdog process. It ignores the signals in [`IGNORED`] from its first
    /// instruction on: they are set to `SIG_IGN` between fork and exec (an ignored signal
    /// stays ignored across exec), so no window exists between exec and the watchdog's own
    /// start-up in which a SIGTERM to every process would end it. (Setting them only in
    /// [`run`] left that window: the dynamic loader and the argument parser run first, and
    /// on a loaded machine a SIGTERM sent right after `fencelock run` started its command
    /// killed the watchdog.)
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
        Ok(Self { child, pipe })
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

    /// `fencelock` is done with the group: the watchdog exits without killing; waits for
    /// it.
    pub fn finish(mut self) {
        if self.send("done\n").is_ok() {
            self.pipe = None;
            let _ = self.child.wait();
        }
    }

    fn send(&mut self, line: &str) -> io::Result<()> {
        match self.pipe.as_mut() {
            Some(pipe) => {
                pipe.write_all(line.as_bytes())?;
                pipe.flush()
            }
            None => Err(io::Error::other("watchdog pipe closed")),
        }
    }
}

/// The signals the watchdog ignores: only fencelock's end may end it. Every catchable
/// signal whose default action ends or stops a process: the ones fencelock forwards to
/// the command (INT, HUP, TERM, QUIT, USR1, USR2: `systemctl kill -s USR1` sends one
/// to every process of the unit, the watchdog among them, while fencelock lives on) and
/// the rest (a watchdog ended by a stray signal would leave the command unguarded should
/// fencelock die later), the real-time ones too ([`ignore_signals`]). It reads its pipe,
/// writes one line to stderr, and sets no timer and no limit.
const IGNORED: [libc::c_int; 20] = [
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGTERM,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGPIPE,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSTKFLT,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Sets every signal in [`IGNORED`] to `SIG_IGN`. Async-signal-safe (only signal(2)), so
/// it may run between fork and exec.
fn ignore_signals() {
    // The real-time signals end a process by default too. `SIGRTMIN()` is the first one
    // the C library leaves to programs (signal(2) refuses the ones it keeps); it reads a
    // value the C library set at start, so it is as safe between fork and exec as the
    // rest of this.
    let real_time = libc::SIGRTMIN()..=libc::SIGRTMAX();
    for signal in IGNORED.into_iter().chain(real_time) {
        // SAFETY: setting a disposition to SIG_IGN installs no handler; called before
        // any other thread exists (in the forked child, or at the watchdog's start).
        unsafe {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
}

/// The watchdog process itself (`fencelock run-watchdog`, started by `fencelock run`).
pub fn run() -> ExitCode {
    // Only fencelock's end (end of file on the pipe) may end the watchdog: a Ctrl-C, a
    // hang-up, or a SIGTERM to every process of a session or a service (systemd's stop,
    // `kill -- -<sid>`) must not leave the command's group unguarded while fencelock
    // itself lives on.
    // They are ignored before exec already (`Watchdog::start`); again here so that a
    // watchdog started some other way is no weaker.
    ignore_signals();
    let mut group: Option<libc::pid_t> = None;
    let stdin = io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return ExitCode::SUCCESS;
        }
        if let Some(pgid) = line
            .strip_prefix("group ")
            .and_then(|g| g.trim().parse::<libc::pid_t>().ok())
            .filter(|pgid| *pgid > 1)
        {
            group = Some(pgid);
        }
    }
    // End of file without `done`: fencelock died.
    if let Some(pgid) = group {
        // SAFETY: kill(2) of the group fencelock started. A group id cannot be reused
        // while any member of the group lives; with none left there is nothing to kill.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        // After the kill, and never a panic: stderr may be a closed pipe by now.
        let _ = writeln!(
            io::stderr(),
            "fencelock run: fencelock died; killed the command's process group {pgid}"
        );
    }
    ExitCode::SUCCESS
}
