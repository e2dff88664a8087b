//! Real `redis-server` processes: standalone masters, replicas, and their faults.

use std::path::PathBuf;
use std::time::Duration;

use redis::AsyncCommands;
use tempfile::TempDir;
use tokio::time::Instant;

use super::TestkitError;
use super::pki::ServerTls;
use super::process::{ServerProcess, find_binary, free_port, log_tail};
use crate::TlsConfig;
use crate::redis::RedisConfig;

/// Environment variable that overrides the path of the `redis-server` binary.
pub const REDIS_BIN_ENV: &str = "FENCELOCK_REDIS_BIN";

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// One `redis-server` on a free loopback port, without persistence. Dropping it stops it.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// With TLS: the TLS port clients use, the server TLS files, and the client TLS
    /// configuration [`config`](Self::config) hands out; `port` is then the harness's own
    /// plaintext port.
    tls: Option<(u16, ServerTls, TlsConfig)>,
    binary: PathBuf,
    replica_of: Option<u16>,
    extra_args: Vec<String>,
    wrapper: Vec<String>,
    process: Option<ServerProcess>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone master.
    pub async fn start() -> Result<Self, TestkitError> {
        Self::launch(None, Vec::new(), Vec::new(), None).await
    }

    /// Starts a standalone master with extra `redis-server` arguments, e.g.
    /// `["--maxmemory-policy", "allkeys-lru"]`.
    pub async fn start_with_args<S: AsRef<str>>(args: &[S]) -> Result<Self, TestkitError> {
        let args = args.iter().map(|s| s.as_ref().to_owned()).collect();
        Self::launch(None, args, Vec::new(), None).await
    }

    /// Starts a standalone master whose clients use TLS (`rediss://`; with
    /// `client_cert_auth`, a client certificate is required); `client` is the TLS
    /// configuration [`config`](Self::config) hands out. The harness keeps a plaintext
    /// loopback port of its own for probes and administration.
    pub async fn start_tls(server: ServerTls, client: TlsConfig) -> Result<Self, TestkitError> {
        Self::launch(None, Vec::new(), Vec::new(), Some((server, client))).await
    }

    /// Starts a replica of `master` and waits until replication is up.
    pub async fn start_replica_of(master: &RedisServer) -> Result<Self, TestkitError> {
        let replica = Self::launch(Some(master.port), Vec::new(), Vec::new(), None).await?;
        replica.await_replication().await?;
        Ok(replica)
    }

    /// Starts a master through a wrapper command: a [`JumpingClock`](super::JumpingClock)'s
    /// [`wrapper`](super::JumpingClock::wrapper) runs it on a clock that can jump.
    pub async fn start_wrapped<S: AsRef<str>>(wrapper: &[S]) -> Result<Self, TestkitError> {
        let wrapper = wrapper.iter().map(|s| s.as_ref().to_owned()).collect();
        Self::launch(None, Vec::new(), wrapper, None).await
    }

    /// Starts the server again on its port after [`kill`](Self::kill), empty (nothing
    /// is persisted), as a master or replica as before; waits until it answers.
    pub async fn restart(&mut self) -> Result<(), TestkitError> {
        if let Some(mut old) = self.process.take() {
            old.kill()
                .map_err(|e| TestkitError::io("stopping redis", e))?;
        }
        self.spawn_and_wait().await
    }

    async fn launch(
        replica_of: Option<u16>,
        extra_args: Vec<String>,
        wrapper: Vec<String>,
        tls: Option<(ServerTls, TlsConfig)>,
    ) -> Result<Self, TestkitError> {
        let binary =
            find_binary("redis-server", REDIS_BIN_ENV).ok_or(TestkitError::BinaryNotFound {
                binary: "redis-server",
                package: "redis-server",
                env_var: REDIS_BIN_ENV,
            })?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = || free_port().map_err(|e| TestkitError::io("finding a port", e));
            let tls = match &tls {
                Some((server, client)) => Some((port()?, server.clone(), client.clone())),
                None => None,
            };
            let mut server = Self {
                port: port()?,
                tls,
                binary: binary.clone(),
                replica_of,
                extra_args: extra_args.clone(),
                wrapper: wrapper.clone(),
                process: None,
                dir: tempfile::Builder::new()
                    .prefix("fencelock-redis-")
                    .tempdir()
                    .map_err(|e| TestkitError::io("creating the redis temp dir", e))?,
            };
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(err) if attempt < 3 && server.log_tail().contains("Address already in use") => {
                    tracing::debug!(%err, "port taken while starting redis; retrying");
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn log_tail(&self) -> String {
        log_tail(&self.log_path(), 20)
    }

    async fn spawn_and_wait(&mut self) -> Result<(), TestkitError> {
        let mut args: Vec<String> = Vec::new();
        let program = match self.wrapper.split_first() {
            Some((program, rest)) => {
                args.extend(rest.iter().cloned());
                args.push(self.binary.display().to_string());
                PathBuf::from(program)
            }
            None => self.binary.clone(),
        };
        args.extend([
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
            // A replica's first sync would otherwise wait 5 s for more replicas to join.
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ]);
        if let Some(master) = self.replica_of {
            args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        }
        if let Some((tls_port, tls, _)) = &self.tls {
            let auth = if tls.client_cert_auth { "yes" } else { "no" };
            args.extend([
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                tls.cert.display().to_string(),
                "--tls-key-file".into(),
                tls.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                tls.ca.display().to_string(),
                "--tls-auth-clients".into(),
                auth.into(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        let process = ServerProcess::start(&program, &args, &self.log_path())
            .map_err(|e| TestkitError::io(format!("starting {}", program.display()), e))?;
        self.process = Some(process);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.ping().await.is_ok() {
                return Ok(());
            }
            let exited = self.process.as_mut().is_none_or(ServerProcess::has_exited);
            if exited || Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!("redis-server on port {}", self.port),
                    waited: START_TIMEOUT,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(drop)
    }

    async fn await_replication(&self) -> Result<(), TestkitError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self
                .info("replication")
                .await?
                .contains("master_link_status:up")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!("replication to port {}", self.port),
                    waited: START_TIMEOUT,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server's URL for clients (`rediss://` when it serves TLS).
    #[must_use]
    pub fn url(&self) -> String {
        match &self.tls {
            Some((tls_port, _, _)) => format!("rediss://127.0.0.1:{tls_port}/"),
            None => self.admin_url(),
        }
    }

    /// The plaintext URL of the harness's own port (the client URL unless it serves TLS).
    #[must_use]
    pub fn admin_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's port for clients (the TLS port when it serves TLS).
    #[must_use]
    pub fn port(&self) -> u16 {
        match &self.tls {
            Some((tls_port, _, _)) => *tls_port,
            None => self.port,
        }
    }

    /// A lock configuration for this server with short timeouts (and the client TLS
    /// configuration, when it serves TLS).
    pub fn config(&self, prefix: &str) -> RedisConfig {
        let config = RedisConfig::new(self.url())
            .with_prefix(prefix)
            .with_connect_timeout(Duration::from_secs(2))
            .with_request_timeout(Duration::from_secs(1));
        match &self.tls {
            Some((_, _, client)) => config.with_tls(client.clone()),
            None => config,
        }
    }

    /// A fresh connection (not shared with any lock client), on the harness's port.
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        redis::Client::open(self.admin_url())?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// `INFO <section>` as text.
    pub async fn info(&self, section: &str) -> Result<String, TestkitError> {
        let mut conn = self.connection().await.map_err(redis_err)?;
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await
            .map_err(redis_err)
    }

    /// How many times `command` (lowercase, e.g. `evalsha`) has run, from
    /// `INFO commandstats`.
    pub async fn command_calls(&self, command: &str) -> Result<u64, TestkitError> {
        let info = self.info("commandstats").await?;
        let prefix = format!("cmdstat_{command}:calls=");
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// `CONFIG RESETSTAT`: zeroes the command statistics.
    pub async fn reset_stats(&self) -> Result<(), TestkitError> {
        let mut conn = self.connection().await.map_err(redis_err)?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut conn)
            .await
            .map_err(redis_err)
    }

    /// Reads a key as a string, if present.
    pub async fn get(&self, key: &str) -> Result<Option<String>, TestkitError> {
        let mut conn = self.connection().await.map_err(redis_err)?;
        conn.get(key).await.map_err(redis_err)
    }

    /// The PID of the server, if it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    fn process(&self) -> Result<&ServerProcess, TestkitError> {
        self.process.as_ref().ok_or_else(|| {
            TestkitError::Cluster(format!("redis on port {} is not running", self.port))
        })
    }

    /// SIGKILL, and wait until it is gone. Nothing is persisted: its data is lost.
    pub fn kill(&mut self) -> Result<(), TestkitError> {
        let mut process = self.process.take().ok_or_else(|| {
            TestkitError::Cluster(format!("redis on port {} is not running", self.port))
        })?;
        process
            .kill()
            .map_err(|e| TestkitError::io("killing redis", e))
    }

    /// SIGSTOP: the server freezes with its connections open (replication stalls too).
    pub fn pause(&self) -> Result<(), TestkitError> {
        self.process()?
            .pause()
            .map_err(|e| TestkitError::io("pausing redis", e))
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) -> Result<(), TestkitError> {
        self.process()?
            .resume()
            .map_err(|e| TestkitError::io("resuming redis", e))
    }

    /// `REPLICAOF NO ONE`: what Sentinel does to promote a replica to master.
    pub async fn promote(&self) -> Result<(), TestkitError> {
        let mut conn = self.connection().await.map_err(redis_err)?;
        redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async::<()>(&mut conn)
            .await
            .map_err(redis_err)
    }

    /// Cuts this replica off from its master without promoting it: it is pointed at a
    /// port where nothing listens, keeps the data it has, and receives nothing more.
    /// Writes to the old master from now on are the ones asynchronous replication loses.
    pub async fn break_replication(&self) -> Result<(), TestkitError> {
        let nowhere = free_port().map_err(|e| TestkitError::io("finding a port", e))?;
        let mut conn = self.connection().await.map_err(redis_err)?;
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(nowhere)
            .query_async::<()>(&mut conn)
            .await
            .map_err(redis_err)
    }

    /// Waits until `replica` has applied every write this master had made when the call
    /// began (its `slave_repl_offset` reaches our `master_repl_offset`).
    ///
    /// Polled from `INFO replication`: `WAIT` would be the event to await, but it only
    /// covers the calling connection's own writes, not the lock client's.
    pub async fn wait_for_replica(
        &self,
        replica: &RedisServer,
        timeout: Duration,
    ) -> Result<(), TestkitError> {
        let target = info_number(&self.info("replication").await?, "master_repl_offset");
        let deadline = Instant::now() + timeout;
        loop {
            let applied = info_number(&replica.info("replication").await?, "slave_repl_offset");
            if applied >= target {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Cluster(format!(
                    "replica at offset {applied}, master at {target} after {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether this server is now a master (`role:master`).
    pub async fn is_master(&self) -> Result<bool, TestkitError> {
        Ok(self.info("replication").await?.contains("role:master"))
    }
}

/// A numeric field of an `INFO` reply (0 if absent).
fn info_number(info: &str, field: &str) -> i64 {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

fn redis_err(err: redis::RedisError) -> TestkitError {
    TestkitError::Cluster(format!("redis request failed: {err}"))
}
