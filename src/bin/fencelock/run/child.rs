//! The command of `fencelock run`: started in a process group of its own, tied to this
//! process's life, and watched without being reaped until the whole group is gone.
//!
//! - The command leads a new process group; every process it starts (a shell's background
//!   jobs included) is in that group unless it leaves on purpose (`setsid`, `setpgid`),
//!   and signals go to the whole group.
//! - The command tells the watchdog its group itself, between fork and exec: by the time
//!   it runs a single instruction of its own, `fencelock`'s death kills the whole group.
//!   (Told by `fencelock` after the spawn, a `fencelock` killed in between left the
//!   command's background processes running.)
//! - `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills the command if the thread that forked
//!   it ends, which for us is the end of this process. The thread that forks it lives
//!   until the command has exited. The rest of the group is the watchdog's job
//!   (`watchdog.rs`).
//! - The command is waited for with `WNOWAIT`: it stays a zombie until we are done with
//!   its group, so its pid, and the group id, cannot be reused by an unrelated process
//!   that a late signal would then hit.
//! - What leaves the group (GNU `timeout`, `setsid`, a daemon) is still `fencelock`'s
//!   descendant (`fencelock` is a child subreaper): it is signalled by pid and waited for
//!   like the group (`tree.rs`).

use std::collections::HashSet;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::tree::{self, Descendants, Process};

/// A running command: the leader of its own process group.
#[derive(Debug)]
pub struct Job {
    pid: libc::pid_t,
    /// The watchdog, a child of ours that is not part of the command.
    watchdog: libc::pid_t,
    exited: Option<oneshot::Receiver<io::Result<Exit>>>,
    reaped: bool,
    /// Processes a signal could not reach (another user's, after `sudo`): warned of once.
    unreachable: Mutex<HashSet<Process>>,
    /// Whether a list of children that could not be read was warned of (once per run).
    unlisted_warned: AtomicBool,
}

/// How the command's main process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl Exit {
    /// The exit status a shell would report: the code, or 128 + the signal.
    pub fn shell_status(self) -> u8 {
        match self {
            Self::Code(code) => u8::try_from(code & 0xff).unwrap_or(1),
            Self::Signal(signal) => u8::try_from(128 + signal).unwrap_or(255),
        }
    }
}

impl Job {
    /// Starts `command` in a new process group, killed by the kernel if this process dies;
    /// before it execs, the command writes `group <its pid>` to `watchdog` (the writing end
    /// of the watchdog's pipe), so that no moment exists in which the group runs unguarded.
    /// `watchdog_pid` is left out of the command's processes. This process becomes the
    /// reaper of the command's orphans, so that none leaves its tree.
    pub fn start(
        mut command: Command,
        watchdog: RawFd,
        watchdog_pid: libc::pid_t,
    ) -> io::Result<Self> {
        tree::become_subreaper()?;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        command.process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid,
        // getpid, signal, sigprocmask, write, _exit by returning an error) are made, and
        // no memory is allocated: the line for the watchdog is formatted on the stack.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::from_raw_os_error(OWN_FAILURE_PDEATHSIG));
                }
                // The parent may have died before the line above took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(OWN_FAILURE_PARENT_GONE));
                }
                inherit_signals();
                announce_group(watchdog)
            });
        }
        let (started_tx, started) = std::sync::mpsc::channel();
        let (exited_tx, exited) = oneshot::channel();
        // The death signal fires when the *thread* that forked the command ends: fork on a
        // thread that waits for the command, so that it outlives it.
        std::thread::Builder::new()
            .name("fencelock-run-child".into())
            .spawn(move || {
                let child = match command.spawn() {
                    Ok(child) => child,
                    Err(err) => {
                        let _ = started_tx.send(Err(err));
                        return;
                    }
                };
                let pid = libc::pid_t::try_from(child.id()).unwrap_or(libc::pid_t::MAX);
                let _ = started_tx.send(Ok(pid));
                // `child` is never waited on through std: that would reap it.
                std::mem::forget(child);
                let _ = exited_tx.send(wait_without_reaping(pid));
            })?;
        let pid = started
            .recv()
            .map_err(|_| io::Error::other("the thread starting the command stopped"))??;
        Ok(Self {
            pid,
            watchdog: watchdog_pid,
            exited: Some(exited),
            reaped: false,
            unreachable: Mutex::default(),
            unlisted_warned: AtomicBool::new(false),
        })
    }

    /// Waits until the command's main process has exited (it is not reaped yet).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a later call picks up the same exit.
    pub async fn exited(&mut self) -> io::Result<Exit> {
        let Some(receiver) = self.exited.as_mut() else {
            return Err(io::Error::other("exit already collected"));
        };
        let exit = receiver
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the thread watching the command stopped")));
        self.exited = None;
        exit
    }

    /// Sends `signal` to every process of the command, once each: its group at once (which
    /// reaches a process forking at that moment too), then by pid each running descendant
    /// that is in another group or session (a second SIGTERM to a process that handled
    /// the first is, to many programs, "stop at once"). A process with none left is not an
    /// error; one the signal cannot reach (another user's) is reported once.
    pub fn signal_all(&self, signal: i32) {
        // SAFETY: kill(2) on the group we created; its leader is not reaped yet, so the
        // group id cannot belong to anyone else.
        let sent = unsafe { libc::kill(-self.pid, signal) };
        if sent != 0 {
            let err = io::Error::last_os_error();
            if !matches!(err.raw_os_error(), Some(libc::ESRCH | libc::EPERM)) {
                super::diag::diag!("cannot signal the command's process group: {err}");
            }
        }
        let members = self.running_members();
        if let Some(unlisted) = &members.unlisted {
            if !self.unlisted_warned.swap(true, Ordering::Relaxed) {
                super::diag::diag!(
                    "warning: cannot list the children of process {} ({}): what runs below \
                     it is unknown, so the lock is held until the list can be read",
                    unlisted.pid,
                    unlisted.error
                );
            }
        }
        for process in members.processes {
            // Members of the group got it above: only asked whether they could (signal 0).
            let sending = if process.group == self.pid { 0 } else { signal };
            if let Err(err) = tree::signal(&process, sending) {
                let mut warned = self
                    .unreachable
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if warned.insert(process) {
                    super::diag::diag!(
                        "warning: cannot signal process {} of the command ({err}): it may \
                         run on after the lock is released",
                        process.pid
                    );
                }
            }
        }
    }

    /// The command's processes that are still running: its descendants (and theirs),
    /// whatever group they moved to, a process whose main thread exited counted while
    /// another thread runs; and whether a list of children could not be read (then
    /// something may run that was not found: not empty). Orphans handed to us that have
    /// exited are reaped first.
    pub fn running_members(&self) -> Descendants {
        self.reap_orphans();
        let mut running = tree::descendants(&[self.watchdog]);
        running.processes.retain(|p| p.running);
        running
    }

    /// Reaps the command's orphans (handed to this process) that have exited; the command
    /// itself stays a zombie until [`reap`](Self::reap).
    pub fn reap_orphans(&self) {
        tree::reap_orphans(&[self.pid, self.watchdog]);
    }

    /// Waits until no process of the command runs (after a SIGKILL to it: a process that
    /// cannot die, in uninterruptible sleep, or one that cannot be signalled, keeps this
    /// waiting, and the lock held).
    pub async fn wait_all_gone(&self) {
        while !self.running_members().is_empty() {
            tokio::time::sleep(super::GROUP_POLL).await;
            self.signal_all(libc::SIGKILL);
        }
    }

    /// Reaps the command's main process, once the group is no longer needed.
    pub fn reap(&mut self) {
        if self.reaped {
            return;
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child; it has exited (or is killed just before).
        unsafe {
            libc::waitpid(self.pid, &mut status, 0);
        }
        self.reaped = true;
    }
}

impl Drop for Job {
    /// Whatever path we leave by, nothing of the command outlives this handle.
    fn drop(&mut self) {
        if !self.reaped {
            self.signal_all(libc::SIGKILL);
            self.reap();
        }
    }
}

/// Signal dispositions the command gets, whatever fencelock inherited (ignored signals
/// survive `exec`; handled ones are reset by it):
///
/// - SIGTERM and SIGCHLD at their defaults: the supervision's SIGTERM must reach the
///   command, and a command whose parent ignored SIGCHLD cannot wait for its own children.
/// - SIGTTIN and SIGTTOU ignored: the command runs in a process group of its own, in the
///   terminal's background, and the terminal would stop it for reading from it (or for
///   writing, with `stty tostop`): stopped for good, with fencelock renewing its lock.
///   Ignored, a read from the terminal fails (`EIO`) and a write goes through.
/// - Nothing blocked: the mask is inherited from the forking thread (the standard
///   library does not reset it), and a parent of fencelock may have blocked SIGTERM.
///
/// Only async-signal-safe calls: this runs between fork and exec.
fn inherit_signals() {
    // SAFETY: signal(2), sigemptyset(3) and sigprocmask(2) are async-signal-safe; no
    // handler is installed, only dispositions; the set lives on this stack.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// The error numbers the command's start reports for fencelock's own failures between
/// fork and exec (a `pre_exec` error reaches the parent only as an error number): ones
/// `execvp` never returns, so that they cannot be taken for the command's.
const OWN_FAILURE_WATCHDOG_GONE: i32 = libc::EPIPE;
const OWN_FAILURE_PARENT_GONE: i32 = libc::ESRCH;
const OWN_FAILURE_PDEATHSIG: i32 = libc::ENOTRECOVERABLE;

/// What went wrong, if `err` is one of fencelock's own failures before exec.
pub fn own_start_failure(err: &io::Error) -> Option<&'static str> {
    match err.raw_os_error()? {
        OWN_FAILURE_WATCHDOG_GONE => Some("the watchdog is gone"),
        OWN_FAILURE_PARENT_GONE => Some("fencelock exited while starting the command"),
        OWN_FAILURE_PDEATHSIG => Some("the kernel refused to tie the command to fencelock's life"),
        _ => None,
    }
}

/// In the forked child, before exec: writes `group <pid>\n` to the watchdog's pipe (the
/// child leads its own group, so its pid is the group id). A watchdog already gone fails
/// the start instead of killing the child with SIGPIPE.
///
/// Only async-signal-safe calls and no allocation: this runs between fork and exec.
fn announce_group(watchdog: RawFd) -> io::Result<()> {
    let mut line = [0u8; 32];
    let prefix = b"group ";
    line[..prefix.len()].copy_from_slice(prefix);
    let mut len = prefix.len();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut digits = [0u8; 12];
    let mut rest = u32::try_from(pid).unwrap_or(0);
    let mut count = 0;
    loop {
        digits[count] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        count += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for digit in digits[..count].iter().rev() {
        line[len] = *digit;
        len += 1;
    }
    line[len] = b'\n';
    len += 1;
    // SAFETY: signal(2) and write(2) are async-signal-safe; `line` is ours. A line this
    // short is written at once (at most PIPE_BUF bytes are atomic).
    let written = unsafe {
        let previous = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let written = libc::write(watchdog, line.as_ptr().cast(), len);
        libc::signal(libc::SIGPIPE, previous);
        written
    };
    if usize::try_from(written).ok() != Some(len) {
        return Err(io::Error::from_raw_os_error(OWN_FAILURE_WATCHDOG_GONE));
    }
    Ok(())
}

/// Blocks until `pid` has exited, leaving it a zombie (`WNOWAIT`).
fn wait_without_reaping(pid: libc::pid_t) -> io::Result<Exit> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value to pass for waitid to fill in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child, writing into `info`.
        let waited = unsafe {
            libc::waitid(
                libc::P_PID,
                libc::id_t::try_from(pid).unwrap_or(0),
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if waited != 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: waitid succeeded for a child that exited, so si_status is set.
        let status = unsafe { info.si_status() };
        return Ok(match info.si_code {
            libc::CLD_EXITED => Exit::Code(status),
            _ => Exit::Signal(status),
        });
    }
}

/// Maps an error starting the command to the status a shell uses: 127 when the program
/// does not exist, 126 when it exists but cannot be run; 70 when the failure is
/// fencelock's own (between fork and exec, [`own_start_failure`]).
pub fn start_failure_status(err: &io::Error) -> u8 {
    if own_start_failure(err).is_some() {
        super::EXIT_INTERNAL
    } else if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Checks that `program` can be found and run (as `execvp` would search `PATH`), before
/// the lock is taken: a typo must not cost a lock holder its turn.
pub fn check_program(program: &str) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |path: &std::path::Path| -> io::Result<()> {
        let meta = std::fs::metadata(path)?;
        if meta.is_dir() || meta.permissions().mode() & 0o111 == 0 {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        Ok(())
    };
    if program.contains('/') {
        return runnable(std::path::Path::new(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let mut denied = None;
    for dir in std::env::split_paths(&path) {
        match runnable(&dir.join(program)) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::PermissionDenied => denied = Some(err),
            Err(_) => {}
        }
    }
    Err(denied.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencelocks_own_failures_before_exec_are_70_and_the_commands_are_126_or_127() {
        let own = io::Error::from_raw_os_error(OWN_FAILURE_WATCHDOG_GONE);
        assert_eq!(start_failure_status(&own), 70);
        let parent_gone = io::Error::from_raw_os_error(OWN_FAILURE_PARENT_GONE);
        assert_eq!(start_failure_status(&parent_gone), 70);
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(start_failure_status(&denied), 126);
        let missing = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(start_failure_status(&missing), 127);
    }
}
