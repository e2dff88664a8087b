//! Server processes started by the harness: spawned so they die with us, stopped by PID.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from one long-lived thread, with `PR_SET_PDEATHSIG = SIGKILL`.
///
/// The kernel sends that signal when the *thread* that forked the child exits, so the
/// fork must happen on a thread that lives as long as the process: then a test binary or a
/// CLI killed outright (no destructors run) still takes its servers with it.
pub(crate) fn spawn_supervised(command: Command) -> io::Result<Child> {
    static LAUNCHER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let launcher = LAUNCHER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("fencelock-launcher".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|err| tracing::error!(%err, "cannot start the launcher thread"));
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    launcher
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, reply))
        .map_err(|_| io::Error::other("launcher thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("launcher thread is gone"))?
}

/// How to run a server process.
#[derive(Clone, Copy, Debug)]
pub struct ProcessOptions {
    /// Run as this (uid, gid) instead of ours (PostgreSQL refuses to run as root).
    pub run_as: Option<(u32, u32)>,
    /// The signal that stops it cleanly when its handle drops; SIGKILL follows after 5 s.
    pub stop_signal: i32,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        Self {
            run_as: None,
            stop_signal: libc::SIGKILL,
        }
    }
}

/// One running server process. Dropping it stops it (its stop signal, then SIGKILL) and
/// reaps it.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    log: PathBuf,
    stop_signal: i32,
}

impl ServerProcess {
    /// Starts `program` with `args`, stdout and stderr appended to `log`, in its own
    /// process group (a Ctrl-C in the terminal reaches only us, and we stop it).
    pub fn start(program: &Path, args: &[String], log: &Path) -> io::Result<Self> {
        Self::start_with(program, args, log, ProcessOptions::default())
    }

    /// [`start`](Self::start) with options.
    pub fn start_with(
        program: &Path,
        args: &[String],
        log: &Path,
        options: ProcessOptions,
    ) -> io::Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        die_with_us(&mut command, options.run_as);
        let child = spawn_supervised(command)?;
        Ok(Self {
            child,
            log: log.to_owned(),
            stop_signal: options.stop_signal,
        })
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a `libc::SIG*` number) to the process.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(io::Error::other)?;
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGSTOP: the process freezes, its sockets stay open (a paused or hung server).
    pub fn pause(&self) -> io::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) -> io::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// SIGKILL, then waits for the process to be gone.
    pub fn kill(&mut self) -> io::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.child.kill()?;
        }
        self.child.wait().map(drop)
    }

    /// Whether the process has exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The last `lines` lines of the process's log, for error messages.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.stop_signal != libc::SIGKILL && self.signal(self.stop_signal).is_ok() {
            // A clean stop (PostgreSQL's fast shutdown) removes shared memory and
            // sockets; give it a moment before the hard kill below.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < until {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        if let Err(err) = self.kill() {
            tracing::warn!(%err, pid = self.child.id(), "could not stop server process");
        }
    }
}

/// Makes `command` run in a process group of its own (a Ctrl-C in the terminal reaches
/// only us, and we stop it), as `run_as` (uid, gid) if given, and get SIGKILL when the
/// thread that forks it exits: spawn it with [`spawn_supervised`], whose thread lives as
/// long as the process.
pub(crate) fn die_with_us(command: &mut Command, run_as: Option<(u32, u32)>) {
    command.process_group(0);
    // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid, prctl) between
    // fork and exec, touching no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            if let Some((uid, gid)) = run_as {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After any change of user: a credential change clears the death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The last `lines` lines of a log file (reading at most its last 64 KiB).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        // The seek may land inside a UTF-8 sequence: decode lossily.
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(no log at {}: {err})", path.display()),
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this process has not
/// handed out before (another process can still take it: starts retry on a bind error).
pub fn free_port() -> io::Result<u16> {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    for _ in 0..64 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut seen = handed_out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free loopback port found"))
}

/// Finds `binary` (or the path in `env_var`, if set) on `PATH`.
pub(crate) fn find_binary(binary: &str, env_var: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        return Some(PathBuf::from(path));
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}
