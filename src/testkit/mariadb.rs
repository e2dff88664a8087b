//! A real MariaDB server: `mariadb-install-db` once into a cached template, then per
//! server a copy of it and `mariadbd` on a free loopback port, stopped by its PID.
//!
//! The server is a plain process with its own data directory, socket and port: the
//! Debian `mariadb` service is neither needed nor touched. Clients authenticate as
//! [`MariaDbServer::USER`] with a password over TCP (so credentials are really checked);
//! the harness itself uses `root` over the server's own Unix socket.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};
use tempfile::TempDir;
use tokio::time::Instant;

use super::TestkitError;
use super::pki::ServerTls;
use super::process::{ProcessOptions, ServerProcess, free_port, log_tail};

/// Environment variable naming the `mariadbd` binary; by default `/usr/sbin/mariadbd`,
/// else `PATH`'s. `mariadb-install-db` is looked for in the `bin` directory beside its
/// `sbin`, then on `PATH`.
pub const MARIADB_BIN_ENV: &str = "FENCELOCK_MARIADB_BIN";

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running MariaDB for tests (no durability: the log is not flushed at commit). Dropping
/// it stops it (SIGTERM, then SIGKILL after 5 s) and removes its data directory.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    tls: bool,
    process: Mutex<Option<ServerProcess>>,
    next_database: AtomicU32,
    // Last: removed after the server is gone.
    dir: TempDir,
}

impl MariaDbServer {
    /// The account clients use over TCP (all privileges, password [`Self::PASSWORD`]).
    pub const USER: &'static str = "fencelock";
    /// The password of [`Self::USER`].
    pub const PASSWORD: &'static str = "fencelock-test-password";

    /// Starts a server from the cached template (made by `mariadb-install-db` on first
    /// use).
    pub async fn start() -> Result<Self, TestkitError> {
        Self::start_with(None).await
    }

    /// Starts a server whose TCP clients must use TLS (`require_secure_transport`; with
    /// `client_cert_auth`, [`Self::USER`] must also present a certificate signed by the
    /// CA). The harness itself still uses the Unix socket.
    pub async fn start_tls(tls: ServerTls) -> Result<Self, TestkitError> {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<ServerTls>) -> Result<Self, TestkitError> {
        let bin = mariadbd().ok_or(TestkitError::BinaryNotFound {
            binary: "mariadbd",
            package: "mariadb-server",
            env_var: MARIADB_BIN_ENV,
        })?;
        let template = template(&bin)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::Builder::new()
                .prefix("fencelock-mariadb-")
                .tempdir()
                .map_err(|e| TestkitError::io("creating the mariadb temp dir", e))?;
            run(Command::new("cp")
                .arg("-a")
                .arg(&template)
                .arg(dir.path().join("data")))?;
            let server = Self {
                port: free_port().map_err(|e| TestkitError::io("finding a port", e))?,
                tls: tls.is_some(),
                process: Mutex::new(None),
                next_database: AtomicU32::new(0),
                dir,
            };
            match server.launch(&bin, tls.as_ref()).await {
                Ok(()) => return Ok(server),
                Err(err) if attempt < 3 && server.log_tail().contains("Address already in use") => {
                    tracing::debug!(%err, "port taken while starting mariadbd; retrying");
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("mariadb.log")
    }

    fn log_tail(&self) -> String {
        log_tail(&self.log_path(), 20)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mariadb.sock")
    }

    async fn launch(&self, bin: &Path, tls: Option<&ServerTls>) -> Result<(), TestkitError> {
        let dir = self.dir.path();
        let mut args: Vec<String> = vec![
            // Nothing from /etc/mysql: this server is the harness's alone.
            "--no-defaults".into(),
            format!("--datadir={}", dir.join("data").display()),
            format!("--socket={}", self.socket().display()),
            format!("--pid-file={}", dir.join("mariadb.pid").display()),
            format!("--tmpdir={}", dir.display()),
            format!("--port={}", self.port),
            "--bind-address=127.0.0.1".into(),
            "--skip-name-resolve".into(),
            "--skip-log-bin".into(),
            // Test data need not survive a crash: no flush at commit, no doublewrite.
            "--innodb-flush-log-at-trx-commit=0".into(),
            "--innodb-doublewrite=0".into(),
            "--innodb-buffer-pool-size=32M".into(),
            "--innodb-log-file-size=16M".into(),
            // Not every file system (tmpfs, overlay) offers native AIO.
            "--innodb-use-native-aio=0".into(),
            // A stuck lock wait fails a test in seconds, not in 50.
            "--innodb-lock-wait-timeout=10".into(),
            "--max-connections=300".into(),
        ];
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // mariadbd refuses to run as root unless told to; the data directory is ours.
            args.push("--user=root".into());
        }
        if let Some(tls) = tls {
            args.extend([
                format!("--ssl-cert={}", tls.cert.display()),
                format!("--ssl-key={}", tls.key.display()),
                format!("--ssl-ca={}", tls.ca.display()),
                "--require-secure-transport=ON".into(),
            ]);
        }
        let options = ProcessOptions {
            run_as: None,
            stop_signal: libc::SIGTERM,
        };
        let process = ServerProcess::start_with(bin, &args, &self.log_path(), options)
            .map_err(|e| TestkitError::io("starting mariadbd", e))?;
        *self.lock_process() = Some(process);
        // Ready means a client gets in, not that some time has passed.
        let deadline = Instant::now() + START_TIMEOUT;
        let mut admin = loop {
            if let Ok(conn) = self.admin_connect().await {
                break conn;
            }
            let exited = self
                .lock_process()
                .as_mut()
                .is_none_or(ServerProcess::has_exited);
            if exited || Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!("mariadbd on port {}", self.port),
                    waited: START_TIMEOUT,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let require = match tls {
            Some(tls) if tls.client_cert_auth => " REQUIRE X509",
            _ => "",
        };
        admin
            .query_drop(format!(
                "CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{password}'{require}",
                user = Self::USER,
                password = Self::PASSWORD,
            ))
            .await
            .map_err(my_err)?;
        admin
            .query_drop(format!(
                "GRANT ALL PRIVILEGES ON *.* TO '{}'@'%'",
                Self::USER
            ))
            .await
            .map_err(my_err)?;
        admin.disconnect().await.map_err(my_err)?;
        Ok(())
    }

    fn lock_process(&self) -> std::sync::MutexGuard<'_, Option<ServerProcess>> {
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server's TCP port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether TCP clients must use TLS.
    #[must_use]
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// A `mysql://` URL for `database` over TCP as [`Self::USER`], for
    /// [`fencelock::mysql::connect`](crate::mysql::connect).
    #[must_use]
    pub fn url(&self, database: &str) -> String {
        format!(
            "mysql://{}:{}@127.0.0.1:{}/{database}",
            Self::USER,
            Self::PASSWORD,
            self.port
        )
    }

    /// Client options for `database` over TCP as [`Self::USER`], plaintext, never
    /// switching to the Unix socket.
    #[must_use]
    pub fn opts(&self, database: &str) -> Opts {
        OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port)
            .user(Some(Self::USER))
            .pass(Some(Self::PASSWORD))
            .db_name(Some(database))
            .prefer_socket(false)
            .into()
    }

    /// Connects to `database` over TCP as [`Self::USER`], plaintext.
    pub async fn connect(&self, database: &str) -> Result<Conn, TestkitError> {
        Conn::new(self.opts(database)).await.map_err(my_err)
    }

    /// Connects as `root` over the server's Unix socket (works whatever the TCP rules).
    pub async fn admin_connect(&self) -> Result<Conn, TestkitError> {
        let opts = OptsBuilder::default()
            .socket(Some(self.socket().display().to_string()))
            .user(Some("root"));
        Conn::new(opts).await.map_err(my_err)
    }

    /// Creates a fresh database and returns its name.
    pub async fn create_database(&self) -> Result<String, TestkitError> {
        let name = format!(
            "test_{}",
            self.next_database.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = self.admin_connect().await?;
        admin
            .query_drop(format!("CREATE DATABASE `{name}`"))
            .await
            .map_err(my_err)?;
        admin.disconnect().await.map_err(my_err)?;
        Ok(name)
    }

    /// The server's `VERSION()`, e.g. `10.11.6-MariaDB-0+deb12u1`.
    pub async fn version(&self) -> Result<String, TestkitError> {
        let mut admin = self.admin_connect().await?;
        let version: Option<String> = admin
            .query_first("SELECT VERSION()")
            .await
            .map_err(my_err)?;
        admin.disconnect().await.map_err(my_err)?;
        version.ok_or_else(|| TestkitError::Cluster("VERSION() returned no row".into()))
    }

    /// SIGKILL, and wait until it is gone (its data directory stays until drop).
    pub fn kill(&self) -> Result<(), TestkitError> {
        let mut process = self
            .lock_process()
            .take()
            .ok_or_else(|| TestkitError::Cluster("mariadbd is not running".into()))?;
        process
            .kill()
            .map_err(|e| TestkitError::io("killing mariadbd", e))
    }

    /// Stops the server (SIGTERM, then SIGKILL) and removes its data directory, through a
    /// shared reference: for a server kept in a `static` until the process exits.
    pub fn stop_and_remove(&self) {
        drop(self.lock_process().take());
        let _ = std::fs::remove_dir_all(self.dir.path());
    }
}

fn my_err(err: mysql_async::Error) -> TestkitError {
    TestkitError::Cluster(format!("mariadb request failed: {err}"))
}

/// `mariadbd`: the override, Debian's `/usr/sbin/mariadbd`, or `PATH`'s.
fn mariadbd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(MARIADB_BIN_ENV) {
        return Some(PathBuf::from(path));
    }
    let debian = PathBuf::from("/usr/sbin/mariadbd");
    if debian.is_file() {
        return Some(debian);
    }
    super::process::find_binary("mariadbd", MARIADB_BIN_ENV)
}

/// `mariadb-install-db`: in `<prefix>/bin` beside `<prefix>/sbin/mariadbd`, or on `PATH`.
fn install_db(mariadbd: &Path) -> Option<PathBuf> {
    let beside = mariadbd
        .parent()
        .and_then(Path::parent)
        .map(|prefix| prefix.join("bin").join("mariadb-install-db"))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        let paths = std::env::var_os("PATH")?;
        std::env::split_paths(&paths)
            .map(|dir| dir.join("mariadb-install-db"))
            .find(|candidate| candidate.is_file())
    })
}

/// The installed data directory, made once per machine, user and server binary.
fn template(bin: &Path) -> Result<PathBuf, TestkitError> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    // The binary's size and mtime stand for its version: a new package gets a new template.
    let stamp = std::fs::metadata(bin)
        .ok()
        .and_then(|m| Some((m.len(), m.modified().ok()?)))
        .and_then(|(len, modified)| {
            let secs = modified
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs();
            Some(format!("{len:x}-{secs:x}"))
        })
        .unwrap_or_else(|| "unknown".into());
    let root = std::env::temp_dir().join(format!("fencelock-mariadb-template-{stamp}-{uid}"));
    let data = root.join("data");
    if data.join("mysql").is_dir() {
        return Ok(data);
    }
    let install = install_db(bin).ok_or(TestkitError::BinaryNotFound {
        binary: "mariadb-install-db",
        package: "mariadb-server",
        env_var: MARIADB_BIN_ENV,
    })?;
    // Build beside it and rename into place, so parallel first runs cannot see half a
    // template; the loser of the race removes its copy.
    let building = tempfile::Builder::new()
        .prefix("fencelock-mariadb-template-building-")
        .tempdir()
        .map_err(|e| TestkitError::io("creating the template dir", e))?;
    let built = building.path().join("data");
    let mut command = Command::new(install);
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", built.display()))
        .arg(format!("--tmpdir={}", building.path().display()))
        // root over the socket with an empty password: the harness's admin account.
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .arg("--innodb-log-file-size=16M");
    if let Some(basedir) = bin.parent().and_then(Path::parent) {
        command.arg(format!("--basedir={}", basedir.display()));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        command.arg("--user=root");
    }
    run(&mut command)?;
    std::fs::create_dir_all(&root).map_err(|e| TestkitError::io("creating the template dir", e))?;
    if std::fs::rename(&built, &data).is_err() && !data.join("mysql").is_dir() {
        return Err(TestkitError::Cluster(format!(
            "could not move the template into {}",
            data.display()
        )));
    }
    Ok(data)
}

/// Runs a short command to completion, failing with its output.
fn run(command: &mut Command) -> Result<(), TestkitError> {
    let output = command
        .output()
        .map_err(|e| TestkitError::io(format!("running {command:?}"), e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(TestkitError::NotReady {
        what: format!("{command:?}"),
        waited: Duration::ZERO,
        log_tail: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
