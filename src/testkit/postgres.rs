//! A real PostgreSQL server: `initdb` once into a cached template, then per server a copy
//! of it and `postgres` on a free loopback port. One database per test.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tempfile::TempDir;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

use super::TestkitError;
use super::pki::ServerTls;
use super::process::{ProcessOptions, ServerProcess, free_port, log_tail};

/// Environment variable naming the directory of the PostgreSQL binaries (`initdb`,
/// `postgres`); by default the newest `/usr/lib/postgresql/*/bin`, else `PATH`.
pub const PG_BIN_DIR_ENV: &str = "FENCELOCK_PG_BIN_DIR";

const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running PostgreSQL for tests (fsync off, trust authentication on loopback, user
/// `postgres`). Dropping it shuts it down (fast shutdown, then SIGKILL).
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    tls: bool,
    process: Option<ServerProcess>,
    next_database: AtomicU32,
    // Last: removed after the server is gone.
    dir: TempDir,
}

impl PostgresServer {
    /// Starts a server from the cached template (made by `initdb` on first use).
    pub async fn start() -> Result<Self, TestkitError> {
        Self::start_with(None).await
    }

    /// Starts a server that accepts TCP clients over TLS only (`hostssl`; with
    /// `client_cert_auth`, a client certificate signed by the CA is required too). The
    /// `postgres` user needs no password; every other role authenticates with a password
    /// (SCRAM). The harness itself uses the Unix socket.
    pub async fn start_tls(tls: ServerTls) -> Result<Self, TestkitError> {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<ServerTls>) -> Result<Self, TestkitError> {
        let bin = bin_dir().ok_or(TestkitError::BinaryNotFound {
            binary: "postgres",
            package: "postgresql",
            env_var: PG_BIN_DIR_ENV,
        })?;
        let user = server_user()?;
        let template = template(&bin, user)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::Builder::new()
                .prefix("fencelock-pg-")
                .tempdir()
                .map_err(|e| TestkitError::io("creating the postgres temp dir", e))?;
            if let Some((uid, gid)) = user {
                chown(dir.path(), uid, gid)?;
            }
            let data = dir.path().join("data");
            run(Command::new("cp").arg("-a").arg(&template).arg(&data), None)?;
            if let Some(tls) = &tls {
                install_tls(&data, tls, user)?;
            }
            let mut server = Self {
                port: free_port().map_err(|e| TestkitError::io("finding a port", e))?,
                tls: tls.is_some(),
                process: None,
                next_database: AtomicU32::new(0),
                dir,
            };
            match server.launch(&bin, user).await {
                Ok(()) => return Ok(server),
                Err(err) if attempt < 3 && server.log_tail().contains("could not bind") => {
                    tracing::debug!(%err, "port taken while starting postgres; retrying");
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn log_tail(&self) -> String {
        log_tail(&self.log_path(), 20)
    }

    async fn launch(&mut self, bin: &Path, user: Option<(u32, u32)>) -> Result<(), TestkitError> {
        let dir = self.dir.path();
        let args: Vec<String> = vec![
            "-D".into(),
            dir.join("data").display().to_string(),
            "-p".into(),
            self.port.to_string(),
            "-k".into(),
            dir.display().to_string(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "fsync=off".into(),
            "-c".into(),
            "synchronous_commit=off".into(),
            "-c".into(),
            "full_page_writes=off".into(),
            "-c".into(),
            "max_connections=300".into(),
            "-c".into(),
            "shared_buffers=32MB".into(),
        ];
        let mut args = args;
        if self.tls {
            for setting in [
                "ssl=on",
                "ssl_cert_file=server.crt",
                "ssl_key_file=server.key",
                "ssl_ca_file=ca.crt",
            ] {
                args.extend(["-c".into(), setting.into()]);
            }
        }
        let options = ProcessOptions {
            run_as: user,
            stop_signal: libc::SIGINT,
        };
        let process =
            ServerProcess::start_with(&bin.join("postgres"), &args, &self.log_path(), options)
                .map_err(|e| TestkitError::io("starting postgres", e))?;
        self.process = Some(process);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.admin_connect("postgres").await.is_ok() {
                return Ok(());
            }
            let exited = self.process.as_mut().is_none_or(ServerProcess::has_exited);
            if exited || Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!("postgres on port {}", self.port),
                    waited: START_TIMEOUT,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq-style connection string for `database` over the server's Unix socket, as
    /// `postgres` (works whatever the TCP rules: TLS only, passwords).
    #[must_use]
    pub fn socket_connection_string(&self, database: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={database} connect_timeout=5",
            self.dir.path().display(),
            self.port
        )
    }

    /// A libpq-style connection string for `database`.
    #[must_use]
    pub fn connection_string(&self, database: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={database} connect_timeout=5",
            self.port
        )
    }

    /// Connects to `database` over TCP, plaintext; the connection runs on a spawned task.
    pub async fn connect(&self, database: &str) -> Result<Client, TestkitError> {
        connect_plain(&self.connection_string(database)).await
    }

    /// Connects to `database` as `postgres` over the Unix socket (works whatever the TCP
    /// rules: TLS only, passwords).
    pub async fn admin_connect(&self, database: &str) -> Result<Client, TestkitError> {
        connect_plain(&self.socket_connection_string(database)).await
    }

    /// Creates a fresh database and returns its name.
    pub async fn create_database(&self) -> Result<String, TestkitError> {
        let name = format!(
            "test_{}",
            self.next_database.fetch_add(1, Ordering::Relaxed)
        );
        let admin = self.admin_connect("postgres").await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(pg_err)?;
        Ok(name)
    }

    /// SIGKILL, and wait until it is gone (its data directory stays).
    pub fn kill(&mut self) -> Result<(), TestkitError> {
        let mut process = self
            .process
            .take()
            .ok_or_else(|| TestkitError::Cluster("postgres is not running".into()))?;
        process
            .kill()
            .map_err(|e| TestkitError::io("killing postgres", e))
    }
}

async fn connect_plain(connection: &str) -> Result<Client, TestkitError> {
    let (client, connection) = tokio_postgres::connect(connection, NoTls)
        .await
        .map_err(pg_err)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Puts the server's certificate, key and CA into the data directory (owned by the server
/// user, the key readable by it alone, as PostgreSQL demands) and allows TCP clients over
/// TLS only.
fn install_tls(data: &Path, tls: &ServerTls, user: Option<(u32, u32)>) -> Result<(), TestkitError> {
    use std::os::unix::fs::PermissionsExt;
    for (from, to, mode) in [
        (&tls.cert, "server.crt", 0o644),
        (&tls.key, "server.key", 0o600),
        (&tls.ca, "ca.crt", 0o644),
    ] {
        let target = data.join(to);
        std::fs::copy(from, &target)
            .map_err(|e| TestkitError::io(format!("copying {}", from.display()), e))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(|e| TestkitError::io(format!("chmod {to}"), e))?;
        if let Some((uid, gid)) = user {
            chown(&target, uid, gid)?;
        }
    }
    let client_cert = if tls.client_cert_auth {
        " clientcert=verify-full"
    } else {
        ""
    };
    let hba = format!(
        "local all all trust\n\
         hostssl all postgres 127.0.0.1/32 trust{client_cert}\n\
         hostssl all all 127.0.0.1/32 scram-sha-256{client_cert}\n\
         hostnossl all all 127.0.0.1/32 reject\n"
    );
    let path = data.join("pg_hba.conf");
    std::fs::write(&path, hba).map_err(|e| TestkitError::io("writing pg_hba.conf", e))?;
    if let Some((uid, gid)) = user {
        chown(&path, uid, gid)?;
    }
    Ok(())
}

fn pg_err(err: tokio_postgres::Error) -> TestkitError {
    TestkitError::Cluster(format!("postgres request failed: {err}"))
}

/// The newest `/usr/lib/postgresql/<version>/bin`, or the override, or `PATH`'s.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(PG_BIN_DIR_ENV) {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).or_else(|| {
        super::process::find_binary("postgres", PG_BIN_DIR_ENV)
            .and_then(|p| p.parent().map(Path::to_path_buf))
    })
}

/// PostgreSQL refuses to run as root: then run it as the `postgres` user.
fn server_user() -> Result<Option<(u32, u32)>, TestkitError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new("postgres").map_err(|e| TestkitError::io("user name", e.into()))?;
    // SAFETY: getpwnam returns null or a pointer to a static record we read at once.
    let record = unsafe { libc::getpwnam(name.as_ptr()) };
    if record.is_null() {
        return Err(TestkitError::Cluster(
            "running as root needs a `postgres` user (the postgresql package creates it)".into(),
        ));
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*record).pw_uid, (*record).pw_gid) };
    Ok(Some((uid, gid)))
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), TestkitError> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| TestkitError::io(format!("chown {}", path.display()), e))
}

/// The initdb'd template data directory, made once per machine and user.
fn template(bin: &Path, user: Option<(u32, u32)>) -> Result<PathBuf, TestkitError> {
    let version = bin
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| "pg".into(), |v| v.to_string_lossy().into_owned());
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let root = std::env::temp_dir().join(format!("fencelock-pg-template-{version}-{uid}"));
    let data = root.join("data");
    if data.join("PG_VERSION").is_file() {
        return Ok(data);
    }
    // Build beside it and rename into place, so parallel first runs cannot see half a
    // template; the loser of the race removes its copy.
    let building = tempfile::Builder::new()
        .prefix("fencelock-pg-template-building-")
        .tempdir()
        .map_err(|e| TestkitError::io("creating the template dir", e))?;
    if let Some((uid, gid)) = user {
        chown(building.path(), uid, gid)?;
    }
    let built = building.path().join("data");
    run(
        Command::new(bin.join("initdb"))
            .arg("-D")
            .arg(&built)
            .args([
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ])
            .args(["--locale=C", "--no-instructions"]),
        user,
    )?;
    std::fs::create_dir_all(&root).map_err(|e| TestkitError::io("creating the template dir", e))?;
    if std::fs::rename(&built, &data).is_err() && !data.join("PG_VERSION").is_file() {
        return Err(TestkitError::Cluster(format!(
            "could not move the template into {}",
            data.display()
        )));
    }
    Ok(data)
}

/// Runs a short command to completion (as `user` if given), failing with its output.
fn run(command: &mut Command, user: Option<(u32, u32)>) -> Result<(), TestkitError> {
    if let Some((uid, gid)) = user {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let output = command
        .output()
        .map_err(|e| TestkitError::io(format!("running {command:?}"), e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(TestkitError::NotReady {
        what: format!("{command:?}"),
        waited: Duration::ZERO,
        log_tail: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}
