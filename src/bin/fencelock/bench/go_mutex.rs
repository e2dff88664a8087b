//! Go's etcd lock as a peer of the etcd rows: `go.etcd.io/etcd/clientv3/concurrency`'s
//! `Mutex` (etcd 3.4's client, the lock most etcd users run), built from Debian's
//! `golang-go` and `golang-etcd-server-dev` when the run starts, then run as a process in
//! the distinct-keys and contended etcd cells. The program is
//! `benches/go_mutex/main.go`, embedded in this binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::BoxResult;
use super::stats::{Cell, histogram, record};
use super::workloads::Runner;

/// The subject of the Go rows.
pub const SUBJECT: &str = "etcd Go concurrency.Mutex";

/// The subject of the Go rows on the local 3-member cluster.
pub const SUBJECT_THREE: &str = "etcd 3 members Go concurrency.Mutex";

/// The Go program, written into the temp dir and built there.
const SOURCE: &str = include_str!("../../../../benches/go_mutex/main.go");

/// Where Debian's `golang-etcd-server-dev` puts etcd's sources and those they import: a
/// GOPATH.
const GOCODE: &str = "/usr/share/gocode";

/// The package of the program inside the temp GOPATH.
const PACKAGE: &str = "fencelock-go-mutex";

/// What to install when Go or the sources are missing.
const INSTALL: &str = "Debian 12: apt-get install golang-go golang-etcd-server-dev; \
    the program needs etcd 3.4's GOPATH sources (go.etcd.io/etcd/clientv3), which \
    Debian 13's etcd 3.5 package no longer has";

/// A Go build cache that outlives the run (CI benches twice per run): without it every
/// run builds etcd's client and gRPC from scratch, about 20 s of a 2-core machine.
const GO_CACHE_ENV: &str = "FENCELOCK_GO_CACHE";

/// The longest the build may take before the Go rows are left out.
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

/// The build's process group, killed by its id if the build is dropped or times out
/// before it ended (`kill_on_drop` reaches `go` alone, not the compilers it started).
struct Group(Option<u32>);

impl Group {
    /// The build ended: nothing of its group is left to stop.
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|pid| libc::pid_t::try_from(pid).ok()) {
            // SAFETY: kill(2) with a negative pid signals that process group (the build's
            // own, made by `process_group(0)`); no memory is touched.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
}

/// `path` made absolute against the current directory (the build runs elsewhere).
fn absolute(path: &Path) -> PathBuf {
    std::env::current_dir().map_or_else(|_| path.to_path_buf(), |dir| dir.join(path))
}

/// The Go peer, built: its binary in a temp dir that lives as long as this value.
pub struct GoMutex {
    binary: PathBuf,
    /// What the binary says of itself: Go's and the etcd client's versions.
    pub version: String,
    _dir: tempfile::TempDir,
}

/// The shape of a Go run: a name per goroutine, or one name for all.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Distinct,
    Contended,
}

impl Mode {
    /// The program's `-mode` value.
    fn flag(self) -> &'static str {
        match self {
            Self::Distinct => "distinct",
            Self::Contended => "contended",
        }
    }
}

/// What one run of the Go program reported.
#[derive(Debug)]
struct Output {
    /// Lock + release latencies, microseconds.
    cycles: Vec<u64>,
    /// Contended runs: (acquired, releasing) in ns since the clock started.
    grants: Vec<(u64, u64)>,
    errors: u64,
    elapsed: Duration,
}

impl Output {
    /// The run's cycles as the `workload` cell of the Go rows at `n` goroutines.
    fn cell(&self, workload: &'static str, subject: &'static str, n: usize) -> BoxResult<Cell> {
        let mut latencies = histogram()?;
        for &micros in &self.cycles {
            record(&mut latencies, Duration::from_micros(micros));
        }
        Ok(Cell::new(
            workload,
            subject,
            n,
            &latencies,
            self.errors,
            self.elapsed,
        ))
    }
}

impl GoMutex {
    /// Builds the peer into a temp dir of its own (GOPATH mode: `GO111MODULE=off`, the
    /// program beside Debian's `/usr/share/gocode`, `GOCACHE` in the temp dir or at
    /// `$FENCELOCK_GO_CACHE`, nothing downloaded). `None`, with one line on stderr, when `go` or the etcd sources are
    /// missing or the build fails: the Go rows are then left out, the bench goes on.
    pub async fn build() -> Option<Self> {
        let concurrency = Path::new(GOCODE).join("src/go.etcd.io/etcd/clientv3/concurrency");
        let go = tokio::process::Command::new("go")
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        if !go.is_ok_and(|status| status.success()) {
            eprintln!("skipping the Go concurrency.Mutex peer: no `go` on PATH ({INSTALL})");
            return None;
        }
        if !concurrency.is_dir() {
            eprintln!(
                "skipping the Go concurrency.Mutex peer: no etcd Go sources at {} ({INSTALL})",
                concurrency.display()
            );
            return None;
        }
        match Self::compile().await {
            Ok(peer) => Some(peer),
            Err(err) => {
                eprintln!("skipping the Go concurrency.Mutex peer: it did not build: {err}");
                None
            }
        }
    }

    /// Writes the program into a new temp dir and builds it there; the error is the
    /// build's last lines of stderr.
    async fn compile() -> BoxResult<Self> {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-go-mutex-")
            .tempdir()?;
        let gopath = dir.path().join("gopath");
        let package = gopath.join("src").join(PACKAGE);
        std::fs::create_dir_all(&package)?;
        std::fs::write(package.join("main.go"), SOURCE)?;
        let binary = dir.path().join("go-mutex");
        let gopath_list = std::env::join_paths([gopath.as_path(), Path::new(GOCODE)])?;
        let started = Instant::now();
        let cache = std::env::var_os(GO_CACHE_ENV)
            .map(PathBuf::from)
            .map_or_else(|| dir.path().join("gocache"), |cache| absolute(&cache));
        let build = tokio::process::Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(&package)
            .env("GO111MODULE", "off")
            .env("GOPATH", gopath_list)
            .env("GOCACHE", cache)
            // A user's -mod=mod or the like has no meaning in GOPATH mode.
            .env("GOFLAGS", "")
            // Pure Go: no C compiler needed, the same binary everywhere.
            .env("CGO_ENABLED", "0")
            .stdin(Stdio::null())
            // A group of its own, so that the compiler and linker `go` starts end with it
            // (see `Group`), not only `go` itself.
            .process_group(0)
            .kill_on_drop(true)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let group = Group(build.id());
        let built = tokio::time::timeout(BUILD_TIMEOUT, build.wait_with_output())
            .await
            .map_err(|_| format!("the build took over {} s", BUILD_TIMEOUT.as_secs()))??;
        group.done();
        if !built.status.success() {
            return Err(last_lines(&built.stderr).into());
        }
        let version = tokio::process::Command::new(&binary)
            .arg("-version")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        eprintln!(
            "built the Go concurrency.Mutex peer ({version}) in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(Self {
            binary,
            version,
            _dir: dir,
        })
    }

    /// Runs the program for `duration` with `n` goroutines; `None` (with a note on stderr)
    /// when it failed, so that a broken peer costs its row, not the run.
    async fn run(
        &self,
        endpoints: &[String],
        mode: Mode,
        n: usize,
        duration: Duration,
        prefix: &str,
    ) -> Option<Output> {
        let outcome = async {
            let child = tokio::process::Command::new(&self.binary)
                .arg("-endpoints")
                .arg(endpoints.join(","))
                .args(["-mode", mode.flag()])
                .args(["-n", &n.to_string()])
                .args(["-duration", &format!("{}us", duration.as_micros())])
                .args(["-prefix", prefix])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output();
            // The program bounds itself at duration + 60 s; this is the backstop.
            let output = tokio::time::timeout(duration + Duration::from_secs(90), child)
                .await
                .map_err(|_| "timed out")??;
            if !output.status.success() {
                return Err(format!("{}: {}", output.status, last_lines(&output.stderr)).into());
            }
            parse(&String::from_utf8_lossy(&output.stdout))
        };
        match outcome.await {
            Ok(output) => Some(output),
            Err(err) => {
                eprintln!(
                    "the Go concurrency.Mutex peer failed ({} {n}, {} member(s)), its row is \
                     left out: {err}",
                    mode.flag(),
                    endpoints.len()
                );
                None
            }
        }
    }
}

impl Runner<'_> {
    /// The Go peer's lock + release cycles on distinct names at concurrency `c`, one
    /// client and one session for all goroutines, after the same compaction as every
    /// etcd cell; `subject` names the row ([`SUBJECT`] for the single member,
    /// [`SUBJECT_THREE`] for the 3-member cluster `endpoints` reach).
    pub async fn go_distinct(
        &mut self,
        peer: &GoMutex,
        subject: &'static str,
        endpoints: &[String],
        c: usize,
    ) -> BoxResult<()> {
        self.step(&format!("{subject} lock+release, concurrency {c}"));
        self.settle().await?;
        // Each row's keys under a prefix of its own (the clusters are apart anyway).
        let row = subject.replace(' ', "-");
        let prefix = format!("bench-go/{}/{row}/distinct-{c}", self.run);
        let Some(output) = peer
            .run(endpoints, Mode::Distinct, c, self.args.duration, &prefix)
            .await
        else {
            self.progress.inc(1);
            return Ok(());
        };
        self.done(output.cell("distinct keys", subject, c)?);
        Ok(())
    }

    /// The Go peer on one name with `w` waiters (a session each: a Go `Mutex` excludes
    /// only other sessions): cycles per second and the handoff latency, measured as the
    /// etcd lock's contended cells measure them.
    pub async fn go_contended(
        &mut self,
        peer: &GoMutex,
        endpoints: &[String],
        w: usize,
    ) -> BoxResult<()> {
        self.step(&format!("{SUBJECT} contended, {w} waiters"));
        self.settle().await?;
        let prefix = format!("bench-go/{}/contended-{w}", self.run);
        let Some(mut output) = peer
            .run(endpoints, Mode::Contended, w, self.args.duration, &prefix)
            .await
        else {
            self.progress.inc(1);
            return Ok(());
        };
        let cell = output.cell("contended", SUBJECT, w)?;
        // Release by one holder to the next holder running, in the order of the grants.
        output.grants.sort_unstable();
        let mut handoffs = histogram()?;
        for pair in output.grants.windows(2) {
            let gap = pair[1].0.saturating_sub(pair[0].1);
            record(&mut handoffs, Duration::from_nanos(gap));
        }
        let mut handoff = Cell::new("handoff", SUBJECT, w, &handoffs, 0, output.elapsed);
        handoff.per_second = cell.per_second;
        self.cells.push(cell);
        if !handoffs.is_empty() {
            self.cells.push(handoff);
        }
        self.progress.inc(1);
        Ok(())
    }
}

/// Reads the program's records (`cycle`, `grant`, `errors`, `elapsed_us`).
fn parse(stdout: &str) -> BoxResult<Output> {
    let mut output = Output {
        cycles: Vec::new(),
        grants: Vec::new(),
        errors: 0,
        elapsed: Duration::ZERO,
    };
    let mut elapsed = None;
    for line in stdout.lines() {
        let mut fields = line.split_whitespace();
        let record = fields.next();
        let mut number = || -> BoxResult<u64> {
            let field = fields
                .next()
                .ok_or_else(|| format!("short line {line:?}"))?;
            field
                .parse()
                .map_err(|err| format!("bad number in {line:?}: {err}").into())
        };
        match record {
            Some("cycle") => output.cycles.push(number()?),
            Some("grant") => output.grants.push((number()?, number()?)),
            Some("errors") => output.errors = number()?,
            Some("elapsed_us") => elapsed = Some(Duration::from_micros(number()?)),
            _ => return Err(format!("unexpected line {line:?}").into()),
        }
    }
    output.elapsed = elapsed.ok_or("no elapsed_us line: the program stopped early")?;
    if output.cycles.is_empty() {
        return Err("no cycle was reported".into());
    }
    Ok(output)
}

/// The last lines of a process's stderr, for a one-line note.
fn last_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// Whether `go` is on `PATH` and etcd's Go sources are installed: what [`GoMutex::build`]
/// needs (it may still fail), without running anything, for the run's time estimate.
pub fn installed() -> bool {
    let sources = Path::new(GOCODE).join("src/go.etcd.io/etcd/clientv3/concurrency");
    let go_on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("go").is_file()));
    go_on_path && sources.is_dir()
}

/// Whether the Go peer can reach the etcd endpoints: plaintext, without credentials (it
/// is given no TLS material nor user).
pub fn reachable(endpoints: &[String], tls: &crate::security::BackendTls) -> bool {
    let plaintext = endpoints.iter().all(|e| !e.starts_with("https://"));
    let secured = tls.etcd_cacert.is_some() || tls.etcd_cert.is_some() || tls.etcd_user.is_some();
    plaintext && !secured
}

#[cfg(test)]
mod tests {
    use super::{last_lines, parse};
    use std::time::Duration;

    #[test]
    fn reads_the_programs_records() {
        let output = parse(
            "cycle 812\ncycle 905\ngrant 1000 1200\ngrant 5000 5100\nerrors 1\nelapsed_us 3000123\n",
        )
        .expect("parses");
        assert_eq!(output.cycles, [812, 905]);
        assert_eq!(output.grants, [(1000, 1200), (5000, 5100)]);
        assert_eq!(output.errors, 1);
        assert_eq!(output.elapsed, Duration::from_micros(3_000_123));
    }

    #[test]
    fn refuses_a_truncated_or_foreign_output() {
        let cases = [
            ("cycle 10\nerrors 0\n", "no elapsed_us"),
            ("errors 0\nelapsed_us 10\n", "no cycle"),
            ("cycle ten\nelapsed_us 10\n", "bad number"),
            ("grant 5\nelapsed_us 10\n", "short line"),
            ("panic: oops\n", "unexpected line"),
        ];
        for (text, says) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn notes_keep_the_last_lines() {
        assert_eq!(last_lines(b"a\n\nb\nc\nd\n"), "b / c / d");
        assert_eq!(last_lines(b""), "");
    }
}
