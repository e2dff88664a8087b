//! Other clients' lock recipes on the same ZooKeeper ensemble: Python's kazoo and Apache
//! Curator, run as real processes the tests drive line by line.
//!
//! Each peer reads one command per line on its stdin and answers one line
//! (`src/testkit/peers/`): `hold RECIPE PATH [PATTERN ...]` (waits up to 20 s: `held`),
//! `try RECIPE PATH MILLIS [PATTERN ...]` (`got`, and holds it, or `blocked`), `release`,
//! `loop RECIPE PATH COUNT MARKER HOLD_MS [PATTERN ...]` (COUNT critical sections, each
//! creating the file MARKER with `O_EXCL` for HOLD_MS: `done SECTIONS OVERLAPS`, an
//! overlap being a marker found already there), `quit`. An answer starting with `error`
//! is the peer's own failure. kazoo's recipes: `lock`, `read`, `write`, `semaphore`
//! (PATTERNs are its `extra_lock_patterns`); Curator's: `mutex`, `read`, `write`,
//! `semaphore` (`InterProcessSemaphoreV2` with one lease).
//!
//! kazoo needs a Python that imports it (Debian's `python3-kazoo`; `FENCELOCK_PYTHON`
//! names the interpreter). Curator needs the JDK's `javac` (`FENCELOCK_JAVAC_BIN`) and
//! Debian's `libcurator-recipes-java` (`FENCELOCK_CURATOR_JAR` names its recipes jar,
//! whose manifest names the jars it needs): the peer is compiled once into a cache
//! directory under the system's temp dir, keyed by its source.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::TestkitError;
use super::process::{find_binary, spawn_supervised};
use super::zookeeper::JAVA_BIN_ENV;

/// Names the Python to run kazoo with.
pub const PYTHON_ENV: &str = "FENCELOCK_PYTHON";
/// Names the JDK's `javac`, which compiles the Curator peer.
pub const JAVAC_BIN_ENV: &str = "FENCELOCK_JAVAC_BIN";
/// Names Curator's recipes jar (default: Debian's `/usr/share/java/curator-recipes.jar`).
pub const CURATOR_JAR_ENV: &str = "FENCELOCK_CURATOR_JAR";

const KAZOO_PEER: &str = include_str!("peers/kazoo_peer.py");
const CURATOR_PEER: &str = include_str!("peers/CuratorPeer.java");

/// How long a peer may take to start and connect before it says `ready`.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A Python that imports kazoo: `$FENCELOCK_PYTHON`, `python3` on `PATH`, or Debian's
/// `/usr/bin/python3` (a `python3` from pyenv or a venv does not see Debian's packages).
#[must_use]
pub fn python_with_kazoo() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(["python3", "/usr/bin/python3"].map(PathBuf::from));
    candidates.into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import kazoo"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// One running peer. Dropping it kills it (by PID) and reaps it.
#[derive(Debug)]
pub struct LockPeer {
    what: &'static str,
    child: Child,
    stdin: ChildStdin,
    replies: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl LockPeer {
    /// A kazoo client connected to `hosts` (a ZooKeeper connect string).
    pub async fn kazoo(hosts: &str) -> Result<Self, TestkitError> {
        let python = python_with_kazoo().ok_or(TestkitError::BinaryNotFound {
            binary: "python3 (with kazoo)",
            package: "python3-kazoo",
            env_var: PYTHON_ENV,
        })?;
        let mut command = Command::new(python);
        command.args(["-c", KAZOO_PEER, hosts]);
        Self::start("kazoo", command).await
    }

    /// A Curator client connected to `hosts` (compiled on first use).
    pub async fn curator(hosts: &str) -> Result<Self, TestkitError> {
        let java = find_binary("java", JAVA_BIN_ENV).ok_or(TestkitError::BinaryNotFound {
            binary: "java",
            package: "default-jre-headless",
            env_var: JAVA_BIN_ENV,
        })?;
        let jar = curator_jar()?;
        let classes = tokio::task::spawn_blocking(move || compiled_curator_peer(&jar))
            .await
            .map_err(|err| TestkitError::io("compiling the Curator peer", err.into()))??;
        let mut command = Command::new(java);
        command.arg("-cp").arg(classes).args(["CuratorPeer", hosts]);
        Self::start("curator", command).await
    }

    async fn start(what: &'static str, mut command: Command) -> Result<Self, TestkitError> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        super::process::die_with_us(&mut command, None);
        let mut child = spawn_supervised(command)
            .map_err(|err| TestkitError::io(format!("starting the {what} peer"), err))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => (stdin, stdout),
            _ => {
                return Err(TestkitError::Cluster(format!(
                    "the {what} peer has no pipes"
                )));
            }
        };
        let (tx, replies) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name(format!("{what}-peer-reader"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            })
            .map_err(|err| TestkitError::io(format!("reading the {what} peer"), err))?;
        let mut peer = Self {
            what,
            child,
            stdin,
            replies,
        };
        // Anything before `ready` is the runtime's own chatter.
        let ready = tokio::time::timeout(START_LIMIT, async {
            while let Some(line) = peer.replies.recv().await {
                if line == "ready" {
                    return true;
                }
            }
            false
        })
        .await;
        if ready != Ok(true) {
            return Err(TestkitError::NotReady {
                what: format!("the {what} peer"),
                waited: START_LIMIT,
                log_tail: String::new(),
            });
        }
        Ok(peer)
    }

    /// Sends `command` and waits up to `limit` for its one-line answer. An answer
    /// starting with `error` is returned as an error.
    pub async fn ask(&mut self, command: &str, limit: Duration) -> Result<String, TestkitError> {
        let what = self.what;
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|err| TestkitError::io(format!("writing to the {what} peer"), err))?;
        let reply = tokio::time::timeout(limit, self.replies.recv()).await;
        match reply {
            Ok(Some(reply)) if reply.starts_with("error") => Err(TestkitError::Cluster(format!(
                "the {what} peer, asked {command:?}: {reply}"
            ))),
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(TestkitError::Cluster(format!(
                "the {what} peer exited while asked {command:?}"
            ))),
            Err(_) => Err(TestkitError::Cluster(format!(
                "the {what} peer did not answer {command:?} within {limit:?}"
            ))),
        }
    }

    /// The peer's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LockPeer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child we have not reaped yet (it cannot have
        // been reused); a dead child is then reaped below.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

fn curator_jar() -> Result<PathBuf, TestkitError> {
    let jar = std::env::var_os(CURATOR_JAR_ENV).map_or_else(
        || PathBuf::from("/usr/share/java/curator-recipes.jar"),
        PathBuf::from,
    );
    if jar.is_file() {
        Ok(jar)
    } else {
        Err(TestkitError::BinaryNotFound {
            binary: "curator-recipes.jar",
            package: "libcurator-recipes-java",
            env_var: CURATOR_JAR_ENV,
        })
    }
}

/// The class path of the compiled Curator peer: compiled once per source and jar into
/// a cache directory, atomically (two test binaries may compile at once).
fn compiled_curator_peer(jar: &Path) -> Result<String, TestkitError> {
    static COMPILING: Mutex<()> = Mutex::new(());
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    let _one = COMPILING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let class_path = |dir: &Path| format!("{}:{}", dir.display(), jar.display());
    if let Some(dir) = CLASSES.get() {
        return Ok(class_path(dir));
    }
    let key = fnv1a(CURATOR_PEER.as_bytes()) ^ fnv1a(jar.as_os_str().as_encoded_bytes());
    let dir = std::env::temp_dir().join(format!("fencelock-curator-peer-{key:016x}"));
    if !dir.join("CuratorPeer.class").is_file() {
        let javac = find_binary("javac", JAVAC_BIN_ENV).ok_or(TestkitError::BinaryNotFound {
            binary: "javac",
            package: "default-jdk-headless",
            env_var: JAVAC_BIN_ENV,
        })?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |err| TestkitError::io(what, err)
        };
        let scratch = tempfile::Builder::new()
            .prefix("fencelock-curator-build-")
            .tempdir()
            .map_err(io("a directory to compile the Curator peer in"))?;
        let source = scratch.path().join("CuratorPeer.java");
        std::fs::write(&source, CURATOR_PEER).map_err(io("writing the Curator peer"))?;
        let output = Command::new(javac)
            .arg("-cp")
            .arg(jar)
            .arg("-d")
            .arg(scratch.path())
            .arg(&source)
            .output()
            .map_err(io("running javac"))?;
        if !output.status.success() {
            return Err(TestkitError::Cluster(format!(
                "javac failed on the Curator peer: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        // Another process may have won the race: its classes are the same.
        let built = scratch.keep();
        if std::fs::rename(&built, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&built);
        }
    }
    let classes = CLASSES.get_or_init(|| dir);
    Ok(class_path(classes))
}

/// The 64-bit FNV-1a hash: a cache key, not a checksum against tampering.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
