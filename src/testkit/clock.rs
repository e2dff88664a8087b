//! A clock that can jump: one server run under `libfaketime` (the `faketime` package),
//! its offset moved at run time through a timestamp file.
//!
//! Debian's `redis-server` allocates with jemalloc, which deadlocks under libfaketime at
//! start-up (jemalloc reads the clock while libfaketime is still resolving symbols:
//! libfaketime issue #130). The wrapper therefore also puts a stand-in
//! `libjemalloc.so.2` on the library path: it exports the three jemalloc-only symbols
//! Redis links to and leaves `malloc` and friends to glibc. It is compiled once with the
//! system C compiler (the one cargo links with).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use super::TestkitError;

/// Where Debian and Ubuntu install the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Environment variable that overrides the path of `libfaketime.so.1`.
pub const LIBFAKETIME_ENV: &str = "FENCELOCK_LIBFAKETIME";

/// The stand-in for jemalloc: the symbols glibc does not have.
const JEMALLOC_STANDIN: &str = r#"
#include <stddef.h>
#include <errno.h>
int mallctl(const char *n, void *o, size_t *ol, void *nw, size_t nl) {
    (void)n; (void)o; (void)ol; (void)nw; (void)nl; return ENOENT;
}
void malloc_stats_print(void (*w)(void *, const char *), void *o, const char *opts) {
    (void)w; (void)o; (void)opts;
}
size_t nallocx(size_t size, int flags) { (void)flags; return size; }
"#;

/// A clock offset shared with the processes started under [`wrapper`](Self::wrapper).
///
/// ```no_run
/// # async fn run() -> Result<(), fencelock::testkit::TestkitError> {
/// use std::time::Duration;
/// use fencelock::testkit::{JumpingClock, RedisServer};
///
/// let clock = JumpingClock::new()?;
/// let wrapper = clock.wrapper()?;
/// let node = RedisServer::start_wrapped(&wrapper).await?;
/// clock.jump_forward(Duration::from_secs(3600))?; // every key with a TTL expires now
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct JumpingClock {
    dir: TempDir,
    library: PathBuf,
}

impl JumpingClock {
    /// A clock at the real time (offset zero).
    pub fn new() -> Result<Self, TestkitError> {
        let library = std::env::var_os(LIBFAKETIME_ENV)
            .map_or_else(|| PathBuf::from(LIBFAKETIME), PathBuf::from);
        if !library.is_file() {
            return Err(TestkitError::BinaryNotFound {
                binary: "libfaketime.so.1",
                package: "faketime",
                env_var: LIBFAKETIME_ENV,
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("fencelock-clock-")
            .tempdir()
            .map_err(|e| TestkitError::io("creating the clock temp dir", e))?;
        let clock = Self { dir, library };
        clock.set_offset("+0")?;
        Ok(clock)
    }

    /// The command prefix that runs a program on this clock: pass it to
    /// [`RedisServer::start_wrapped`](super::RedisServer::start_wrapped).
    pub fn wrapper(&self) -> Result<Vec<String>, TestkitError> {
        let standin = jemalloc_standin()?;
        Ok(vec![
            "env".to_owned(),
            format!("LD_LIBRARY_PATH={}", standin.display()),
            format!("LD_PRELOAD={}", self.library.display()),
            format!("FAKETIME_TIMESTAMP_FILE={}", self.offset_file().display()),
            // Read the file on every clock call, so that a jump is seen at once.
            "FAKETIME_NO_CACHE=1".to_owned(),
        ])
    }

    /// Moves the clock `by` ahead of real time, at once (not cumulative: a second call
    /// sets a new offset from real time).
    pub fn jump_forward(&self, by: Duration) -> Result<(), TestkitError> {
        self.set_offset(&format!("+{}", by.as_secs().max(1)))
    }

    /// Moves the clock back to real time.
    pub fn reset(&self) -> Result<(), TestkitError> {
        self.set_offset("+0")
    }

    fn offset_file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    fn set_offset(&self, offset: &str) -> Result<(), TestkitError> {
        // Write beside, then rename: a reader never sees a half-written offset.
        let staged = self.dir.path().join("offset.new");
        std::fs::write(&staged, format!("{offset}\n"))
            .and_then(|()| std::fs::rename(&staged, self.offset_file()))
            .map_err(|e| TestkitError::io("writing the clock offset", e))
    }
}

/// Builds the jemalloc stand-in once per process; returns its directory.
fn jemalloc_standin() -> Result<&'static Path, TestkitError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_standin().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|reason| TestkitError::Cluster(format!("jemalloc stand-in: {reason}")))
}

/// One shared directory for every process (the library is the same for all): built once,
/// then reused; concurrent builders each compile to a file of their own and rename it into
/// place, so a reader never sees a half-written library.
fn build_standin() -> Result<PathBuf, TestkitError> {
    let dir = std::env::temp_dir().join("fencelock-jemalloc-standin");
    let library = dir.join("libjemalloc.so.2");
    if library.is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| TestkitError::io("creating the stand-in dir", e))?;
    let pid = std::process::id();
    let source = dir.join(format!("standin-{pid}.c"));
    let staged = dir.join(format!("libjemalloc-{pid}.so"));
    std::fs::write(&source, JEMALLOC_STANDIN)
        .map_err(|e| TestkitError::io("writing the stand-in source", e))?;
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let output = Command::new(&compiler)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libjemalloc.so.2",
            "-o",
        ])
        .arg(&staged)
        .arg(&source)
        .output()
        .map_err(|e| TestkitError::io(format!("running {compiler}"), e));
    let _ = std::fs::remove_file(&source);
    let output = output?;
    if !output.status.success() {
        return Err(TestkitError::Cluster(format!(
            "{compiler} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::rename(&staged, &library)
        .map_err(|e| TestkitError::io("installing the stand-in", e))?;
    Ok(dir)
}
