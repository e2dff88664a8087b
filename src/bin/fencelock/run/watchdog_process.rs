//! The watchdog process itself (`fencelock run-watchdog`, started by `fencelock run`):
//! reads its pipe (the lines of `watchdog.rs`), and SIGKILLs the command's group when the
//! pipe ends or the last `kill-at` time passes, whichever comes first.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use super::watchdog::BootTime;

/// The signals the watchdog ignores: only fencelock (its end, or its SIGKILL when done)
/// may end it. Every catchable
/// signal whose default action ends or stops a process: the ones fencelock forwards to
/// the command (INT, HUP, TERM, QUIT, USR1, USR2: `systemctl kill -s USR1` sends one
/// to every process of the unit, the watchdog among them, while fencelock lives on) and
/// the rest (a watchdog ended by a stray signal would leave the command unguarded should
/// fencelock die later), the real-time ones too ([`ignore_signals`]). It reads its pipe,
/// waits in `poll` with a timeout, writes one line to stderr, and sets no alarm (SIGALRM
/// is ignored anyway) and no limit.
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
pub(super) fn ignore_signals() {
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

/// The longest the watchdog sleeps while a `kill-at` is pending: `poll`'s timeout runs
/// on `CLOCK_MONOTONIC`, which stands still while the machine is suspended, so the
/// watchdog looks at `CLOCK_BOOTTIME` at least this often (a deadline that passed during
/// a suspension is acted on this soon after the resumption).
const LOOK: Duration = Duration::from_millis(100);

/// What the watchdog knows, from its pipe.
#[derive(Debug, Default)]
struct Guarding {
    /// The command's process group (`group`).
    group: Option<libc::pid_t>,
    /// When to kill it (`kill-at`).
    kill_at: Option<BootTime>,
    /// It was killed because `kill_at` passed.
    killed: bool,
    /// A line not ended yet.
    partial: Vec<u8>,
}

impl Guarding {
    /// Takes in what was read from the pipe, whole lines only (the rest waits for its end).
    fn read(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(String::from_utf8_lossy(&line[..end]).trim());
        }
    }

    fn line(&mut self, line: &str) {
        if let Some(pgid) = line
            .strip_prefix("group ")
            .and_then(|g| g.trim().parse::<libc::pid_t>().ok())
            .filter(|pgid| *pgid > 1)
        {
            self.group = Some(pgid);
        } else if line == "stand-down" {
            self.kill_at = None;
        } else if let Some(at) = line
            .strip_prefix("kill-at ")
            .and_then(|at| at.trim().parse::<u64>().ok())
        {
            self.kill_at = Some(BootTime::from_nanos(at));
        }
    }

    /// Kills the group if its `kill-at` has passed; returns how long to sleep at most
    /// before the next look (`None`: until the pipe says something).
    fn enforce(&mut self, now: Option<BootTime>) -> Option<Duration> {
        if self.killed {
            return None;
        }
        let at = self.kill_at?;
        // A clock that cannot be read: treat the deadline as passed (kill, never run on).
        let left = now.map_or(Duration::ZERO, |now| now.until(at));
        if !left.is_zero() {
            return Some(left.min(LOOK));
        }
        let pgid = self.group?;
        self.killed = true;
        kill_group(pgid);
        let _ = writeln!(
            io::stderr(),
            "fencelock run: the lease deadline passed without word from fencelock (stopped?); \
             sent SIGKILL to the command's process group {pgid}"
        );
        None
    }
}

/// SIGKILL to the group.
fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) of the group fencelock started. A group id cannot be reused while
    // any member of the group lives, its leader's zombie included (fencelock reaps the
    // leader only after it killed this watchdog: `watchdog.rs`); with none left there is
    // nothing to kill.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Waits until the pipe can be read (or has ended) or `timeout` passed; says which. An
/// interrupted wait says "not readable": the caller simply looks again. A wait that
/// fails otherwise (no memory) is retried after [`LOOK`], not at once in a loop.
fn wait_for_pipe(timeout: Option<Duration>) -> bool {
    let mut pipe = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // Rounded up: a timeout cut to 0 ms would spin until the deadline.
    let millis = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX)
    });
    // SAFETY: poll(2) on one pollfd of ours.
    let ready = unsafe { libc::poll(&raw mut pipe, 1, millis) };
    if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
        std::thread::sleep(LOOK);
    }
    ready > 0
}

/// The watchdog process itself (`fencelock run-watchdog`, started by `fencelock run`).
pub fn run() -> ExitCode {
    // Only fencelock's end (end of file on the pipe) or the deadline may end the
    // watchdog's watch: a Ctrl-C, a hang-up, or a SIGTERM to every process of a session
    // or a service (systemd's stop, `kill -- -<sid>`) must not leave the command's group
    // unguarded while fencelock itself lives on.
    // They are ignored before exec already (`Watchdog::start`); again here so that a
    // watchdog started some other way is no weaker.
    ignore_signals();
    let mut guarding = Guarding::default();
    let mut buffer = [0u8; 512];
    'watch: loop {
        let timeout = guarding.enforce(BootTime::now());
        if !wait_for_pipe(timeout) {
            continue;
        }
        // Everything queued, before the next look at the deadline: a watchdog that fell
        // behind (stopped itself for a while) acts on fencelock's latest deadline, never
        // on a stale one from the middle of the queue.
        loop {
            // SAFETY: read(2) into our buffer, at most its length; poll said it will not
            // block.
            let read =
                unsafe { libc::read(libc::STDIN_FILENO, buffer.as_mut_ptr().cast(), buffer.len()) };
            match usize::try_from(read) {
                Ok(0) => break 'watch,
                Ok(read) => guarding.read(&buffer[..read]),
                Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break 'watch,
            }
            if !wait_for_pipe(Some(Duration::ZERO)) {
                break;
            }
        }
    }
    // End of file: fencelock died (when it is done, it kills the watchdog instead).
    if let Some(pgid) = guarding.group {
        kill_group(pgid);
        // After the kill, and never a panic: stderr may be a closed pipe by now.
        if !guarding.killed {
            let _ = writeln!(
                io::stderr(),
                "fencelock run: fencelock died; killed the command's process group {pgid}"
            );
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipe_is_read_by_whole_lines() {
        let mut guarding = Guarding::default();
        guarding.read(b"kill-at 12");
        assert_eq!(guarding.kill_at, None, "a line not ended yet");
        guarding.read(b"34\ngroup 4");
        assert_eq!(guarding.kill_at, Some(BootTime::from_nanos(1234)));
        guarding.read(b"2\nkill-at 99\n");
        assert_eq!(guarding.group, Some(42));
        assert_eq!(guarding.kill_at, Some(BootTime::from_nanos(99)));
        guarding.read(b"group 1\ngroup x\nkill-at -3\n");
        assert_eq!(
            guarding.group,
            Some(42),
            "never init's group, never garbage"
        );
        assert_eq!(guarding.kill_at, Some(BootTime::from_nanos(99)));
        guarding.read(b"stand-down\n");
        assert_eq!(guarding.kill_at, None, "fencelock killed the group itself");
    }

    #[test]
    fn a_pending_deadline_is_looked_at_again_soon_enough() {
        let mut guarding = Guarding::default();
        let now = BootTime::from_nanos(1_000_000_000);
        assert_eq!(guarding.enforce(Some(now)), None, "nothing to enforce yet");
        guarding.kill_at = Some(now.after(Duration::from_millis(30)));
        assert_eq!(guarding.enforce(Some(now)), Some(Duration::from_millis(30)));
        guarding.kill_at = Some(now.after(Duration::from_secs(30)));
        assert_eq!(guarding.enforce(Some(now)), Some(LOOK));
        // Passed, with no group announced yet: nothing to kill, nothing marked killed.
        assert_eq!(
            guarding.enforce(Some(now.after(Duration::from_secs(31)))),
            None
        );
        assert!(!guarding.killed);
    }
}
