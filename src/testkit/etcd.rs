//! Real etcd processes: a single node or a cluster, on free loopback ports in a temp dir.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::Client;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::TestkitError;
use super::pki::ServerTls;
use super::process::{ServerProcess, find_binary, free_port};
use crate::TlsConfig;
use crate::etcd::EtcdConfig;

/// Environment variable that overrides the path of the `etcd` binary.
pub const ETCD_BIN_ENV: &str = "FENCELOCK_ETCD_BIN";

const START_TIMEOUT: Duration = Duration::from_secs(20);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How to start an [`EtcdCluster`].
#[derive(Clone, Debug)]
#[must_use]
pub struct EtcdClusterBuilder {
    members: usize,
    heartbeat: Duration,
    election: Duration,
    fsync: bool,
    binary: Option<PathBuf>,
    /// `--auth-token-ttl`, when set.
    auth_token_ttl: Option<Duration>,
    /// Signed JWT auth tokens (`--auth-token=jwt,...`) instead of simple ones.
    jwt: bool,
    // Boxed: rarely set, and the builder travels inside every cluster handle.
    tls: Option<Box<(ServerTls, TlsConfig)>>,
}

impl Default for EtcdClusterBuilder {
    fn default() -> Self {
        Self {
            members: 1,
            heartbeat: Duration::from_millis(25),
            election: Duration::from_millis(250),
            fsync: false,
            binary: None,
            auth_token_ttl: None,
            jwt: false,
            tls: None,
        }
    }
}

impl EtcdClusterBuilder {
    /// Number of members (default 1).
    pub fn members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Raft heartbeat interval and election timeout. The defaults (25 ms / 250 ms) keep
    /// starts and failovers fast and allow 1 s leases (etcd's minimum lease TTL is
    /// 1.5 x the election timeout); etcd's own defaults are 100 ms / 1 s.
    pub fn timing(mut self, heartbeat: Duration, election: Duration) -> Self {
        self.heartbeat = heartbeat;
        self.election = election;
        self
    }

    /// Whether etcd fsyncs its WAL (default off, through `--unsafe-no-fsync`: killing a
    /// process loses no written data either way, only a machine crash would).
    pub fn fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }

    /// How long etcd keeps an idle simple auth token (`--auth-token-ttl`, whole seconds,
    /// at least 1; etcd's default is 300 s): a client quiet for longer must authenticate
    /// again.
    pub fn auth_token_ttl(mut self, ttl: Duration) -> Self {
        self.auth_token_ttl = Some(ttl);
        self
    }

    /// Issues signed JWT auth tokens (`--auth-token=jwt`, ES256, with a key pair made in
    /// the cluster's directory) instead of etcd's default simple tokens. A JWT carries
    /// the auth store's revision it was issued at: after any change of users or roles,
    /// etcd refuses it as "revision of auth store is old" until the client authenticates
    /// again (a simple token is looked up at each request instead, and stays valid).
    pub fn jwt_tokens(mut self) -> Self {
        self.jwt = true;
        self
    }

    /// The `etcd` binary to run (default: `$FENCELOCK_ETCD_BIN`, else `etcd` on `PATH`).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Serves clients over TLS only (`https://` endpoints; with `client_cert_auth`, a
    /// client certificate is required), as a production cluster would; `client` is the
    /// TLS configuration [`EtcdCluster::config`] hands out. Each member also listens on a
    /// plaintext loopback port of the harness's own ([`EtcdCluster::admin_endpoint`]), for
    /// readiness probes, metrics and the tests' administrative client.
    pub fn tls(mut self, server: ServerTls, client: TlsConfig) -> Self {
        self.tls = Some(Box::new((server, client)));
        self
    }

    /// Starts the members and waits until they agree on a leader. A port taken by someone
    /// else between our probe and etcd's bind is retried with fresh ports.
    pub async fn start(self) -> Result<EtcdCluster, TestkitError> {
        if self.members == 0 {
            return Err(TestkitError::Cluster(
                "a cluster needs at least one member".into(),
            ));
        }
        let found = self
            .binary
            .clone()
            .or_else(|| find_binary("etcd", ETCD_BIN_ENV));
        let binary = found.ok_or(TestkitError::BinaryNotFound {
            binary: "etcd",
            package: "etcd-server",
            env_var: ETCD_BIN_ENV,
        })?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut cluster = EtcdCluster::prepare(self.clone(), binary.clone())?;
            match cluster.launch_all().await {
                Ok(()) => return Ok(cluster),
                Err(err) if attempt < 3 && cluster.lost_a_port() => {
                    tracing::debug!(%err, "port taken while starting etcd; retrying");
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// A running etcd cluster (or single node) for tests. Dropping it stops every member.
#[derive(Debug)]
pub struct EtcdCluster {
    settings: EtcdClusterBuilder,
    binary: PathBuf,
    members: Vec<Member>,
    // Last: removed after the processes are gone.
    dir: TempDir,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    /// The plaintext port for the harness when clients use TLS (else the client port).
    admin_port: u16,
    peer_port: u16,
    process: Option<ServerProcess>,
}

impl EtcdCluster {
    /// A builder for a cluster of any size.
    pub fn builder() -> EtcdClusterBuilder {
        EtcdClusterBuilder::default()
    }

    /// Starts a single-node etcd with the default settings.
    pub async fn single() -> Result<Self, TestkitError> {
        Self::builder().start().await
    }

    fn prepare(settings: EtcdClusterBuilder, binary: PathBuf) -> Result<Self, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-etcd-")
            .tempdir()
            .map_err(|e| TestkitError::io("creating the etcd temp dir", e))?;
        let members = (0..settings.members)
            .map(|i| {
                let port = || free_port().map_err(|e| TestkitError::io("finding a port", e));
                let client_port = port()?;
                Ok(Member {
                    name: format!("m{i}"),
                    client_port,
                    admin_port: if settings.tls.is_some() {
                        port()?
                    } else {
                        client_port
                    },
                    peer_port: port()?,
                    process: None,
                })
            })
            .collect::<Result<Vec<_>, TestkitError>>()?;
        Ok(Self {
            settings,
            binary,
            members,
            dir,
        })
    }

    async fn launch_all(&mut self) -> Result<(), TestkitError> {
        for i in 0..self.members.len() {
            self.launch(i, "new")?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..self.members.len() {
            self.await_ready(i, deadline).await?;
        }
        Ok(())
    }

    fn launch(&mut self, i: usize, state: &str) -> Result<(), TestkitError> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let member = &self.members[i];
        let client_url = self.endpoint(i);
        let listen = if self.settings.tls.is_some() {
            format!("{client_url},{}", self.admin_endpoint(i))
        } else {
            client_url.clone()
        };
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let data_dir = self.dir.path().join(&member.name);
        let mut args = vec![
            format!("--name={}", member.name),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={listen}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-state={state}"),
            format!("--initial-cluster-token={}", self.cluster_token()),
            format!(
                "--heartbeat-interval={}",
                self.settings.heartbeat.as_millis()
            ),
            format!("--election-timeout={}", self.settings.election.as_millis()),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        if !self.settings.fsync {
            args.push("--unsafe-no-fsync".into());
        }
        if let Some(ttl) = self.settings.auth_token_ttl {
            args.push(format!("--auth-token-ttl={}", ttl.as_secs().max(1)));
        }
        if self.settings.jwt {
            args.push(self.jwt_flag()?);
        }
        if let Some(tls) = self.settings.tls.as_deref().map(|(tls, _)| tls) {
            args.push(format!("--cert-file={}", tls.cert.display()));
            args.push(format!("--key-file={}", tls.key.display()));
            // etcd asks for client certificates whenever it has a CA for them.
            if tls.client_cert_auth {
                args.push(format!("--trusted-ca-file={}", tls.ca.display()));
                args.push("--client-cert-auth".into());
            }
        }
        let log = self.log_path(i);
        let process = ServerProcess::start(&self.binary, &args, &log)
            .map_err(|e| TestkitError::io(format!("starting {}", self.binary.display()), e))?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// `--auth-token=jwt,...` with the cluster's signing key pair, written into its
    /// directory the first time (every member and every restart signs with the same key).
    fn jwt_flag(&self) -> Result<String, TestkitError> {
        let private = self.dir.path().join("jwt-private.pem");
        let public = self.dir.path().join("jwt-public.pem");
        if !private.exists() {
            let key = rcgen::KeyPair::generate().map_err(|e| {
                TestkitError::Cluster(format!("generating the JWT signing key: {e}"))
            })?;
            std::fs::write(&public, key.public_key_pem())
                .map_err(|e| TestkitError::io("writing the JWT public key", e))?;
            std::fs::write(&private, key.serialize_pem())
                .map_err(|e| TestkitError::io("writing the JWT private key", e))?;
        }
        Ok(format!(
            "--auth-token=jwt,pub-key={},priv-key={},sign-method=ES256",
            public.display(),
            private.display()
        ))
    }

    fn cluster_token(&self) -> String {
        let dir = self.dir.path().file_name().unwrap_or_default();
        format!("fencelock-{}", dir.to_string_lossy())
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Waits until member `i` answers and knows a leader.
    async fn await_ready(&mut self, i: usize, deadline: Instant) -> Result<(), TestkitError> {
        let endpoint = self.admin_endpoint(i);
        loop {
            if let Ok(Ok(leader)) =
                tokio::time::timeout(PROBE_TIMEOUT, status_leader(&endpoint)).await
            {
                if leader.1 != 0 {
                    return Ok(());
                }
            }
            let exited = self.members[i]
                .process
                .as_mut()
                .is_none_or(ServerProcess::has_exited);
            if exited || Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!("etcd member {} ({endpoint})", self.members[i].name),
                    waited: START_TIMEOUT,
                    log_tail: super::process::log_tail(&self.log_path(i), 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lost_a_port(&self) -> bool {
        (0..self.members.len()).any(|i| {
            super::process::log_tail(&self.log_path(i), 50).contains("address already in use")
        })
    }

    /// Number of members.
    #[must_use]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never true for a started cluster).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The client URL of member `i` (`https://` when the cluster serves TLS).
    #[must_use]
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// The plaintext URL of member `i` for the harness and the tests' own administration
    /// (the client URL itself unless the cluster serves TLS).
    #[must_use]
    pub fn admin_endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].admin_port)
    }

    fn admin_endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|i| self.admin_endpoint(i))
            .collect()
    }

    /// The client URLs of all members.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// A lock configuration for this cluster with short timeouts, in `namespace` (with
    /// the cluster's client TLS configuration, if it serves TLS).
    pub fn config(&self, namespace: &str) -> EtcdConfig {
        let config = test_config(self.endpoints(), namespace);
        match self.settings.tls.as_deref() {
            Some((_, client)) => config.with_tls(client.clone()),
            None => config,
        }
    }

    /// A plain etcd client connected to all members (over the administrative ports).
    pub async fn client(&self) -> Result<Client, TestkitError> {
        Ok(Client::connect(self.admin_endpoints(), None).await?)
    }

    /// A plain etcd client authenticated as `user` (after auth is enabled).
    pub async fn client_as(&self, user: &str, password: &str) -> Result<Client, TestkitError> {
        let options = etcd_client::ConnectOptions::new().with_user(user, password);
        Ok(Client::connect(self.admin_endpoints(), Some(options)).await?)
    }

    /// The PID of member `i`, if it runs.
    #[must_use]
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members
            .get(i)?
            .process
            .as_ref()
            .map(ServerProcess::pid)
    }

    fn process(&self, i: usize) -> Result<&ServerProcess, TestkitError> {
        self.members
            .get(i)
            .and_then(|m| m.process.as_ref())
            .ok_or_else(|| TestkitError::Cluster(format!("member {i} is not running")))
    }

    /// SIGKILLs member `i` and waits until it is gone.
    pub fn kill(&mut self, i: usize) -> Result<(), TestkitError> {
        let mut process = self
            .members
            .get_mut(i)
            .and_then(|m| m.process.take())
            .ok_or_else(|| TestkitError::Cluster(format!("member {i} is not running")))?;
        process
            .kill()
            .map_err(|e| TestkitError::io(format!("killing member {i}"), e))
    }

    /// SIGSTOPs member `i`: it stops answering but keeps its sockets open.
    pub fn pause(&self, i: usize) -> Result<(), TestkitError> {
        self.process(i)?
            .pause()
            .map_err(|e| TestkitError::io(format!("pausing member {i}"), e))
    }

    /// SIGCONTs member `i` after [`pause`](Self::pause).
    pub fn resume(&self, i: usize) -> Result<(), TestkitError> {
        self.process(i)?
            .resume()
            .map_err(|e| TestkitError::io(format!("resuming member {i}"), e))
    }

    /// Starts a killed member again on its old ports and data, and waits until it is back.
    pub async fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        if i >= self.members.len() {
            return Err(TestkitError::Cluster(format!("no member {i}")));
        }
        if let Some(mut old) = self.members[i].process.take() {
            old.kill()
                .map_err(|e| TestkitError::io(format!("stopping member {i}"), e))?;
        }
        self.launch(i, "existing")?;
        self.await_ready(i, Instant::now() + START_TIMEOUT).await
    }

    /// The index of the current leader, asking the running members.
    pub async fn leader(&self) -> Result<usize, TestkitError> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for i in 0..self.members.len() {
            if self.members[i].process.is_none() {
                continue;
            }
            if let Ok(Ok((id, leader))) =
                tokio::time::timeout(PROBE_TIMEOUT, status_leader(&self.admin_endpoint(i))).await
            {
                ids.push((i, id));
                if leader != 0 {
                    leaders.push(leader);
                }
            }
        }
        // A member may still remember a dead leader: trust only a leader that answered.
        leaders
            .iter()
            .find_map(|leader| ids.iter().find(|(_, id)| id == leader).map(|(i, _)| *i))
            .ok_or_else(|| TestkitError::Cluster("no member reports a live leader".into()))
    }

    /// Waits (up to 20 s) until the running members report a live leader.
    pub async fn wait_for_leader(&self) -> Result<usize, TestkitError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.leader().await {
                Ok(leader) => return Ok(leader),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Compacts the keyspace at the current revision; returns that revision.
    pub async fn compact(&self) -> Result<i64, TestkitError> {
        compact_now(&mut self.client().await?).await
    }

    /// The Prometheus metrics text of member `i` (`GET /metrics` on its client port, or
    /// on its administrative port when it serves TLS).
    pub async fn metrics(&self, i: usize) -> Result<String, TestkitError> {
        fetch_metrics(&self.admin_endpoint(i)).await
    }
}

/// The lock configuration the harness hands out: short timeouts, in `namespace`.
pub(super) fn test_config(endpoints: Vec<String>, namespace: &str) -> EtcdConfig {
    EtcdConfig::new(endpoints)
        .with_namespace(namespace)
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Duration::from_secs(3))
}

/// Compacts the keyspace of the cluster `client` talks to at its current revision
/// (physically: the old revisions are gone when it returns); returns that revision.
pub async fn compact_now(client: &mut Client) -> Result<i64, TestkitError> {
    let revision = client
        .get("compaction-probe", None)
        .await?
        .header()
        .map(|h| h.revision())
        .unwrap_or_default();
    client
        .compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await?;
    Ok(revision)
}

/// The Prometheus metrics text of the etcd member at `endpoint` (`http://host:port`):
/// `GET /metrics`, which etcd serves on its client port.
pub async fn fetch_metrics(endpoint: &str) -> Result<String, TestkitError> {
    let address = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let io = |e| TestkitError::io(format!("reading metrics of {endpoint}"), e);
    let mut stream = tokio::net::TcpStream::connect(address).await.map_err(io)?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .map_err(io)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(io)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response))
}

/// (member id, leader id) as reported by the member at `endpoint`.
pub(super) async fn status_leader(endpoint: &str) -> Result<(u64, u64), etcd_client::Error> {
    let mut client = Client::connect([endpoint], None).await?;
    let status = client.status().await?;
    let id = status.header().map(|h| h.member_id()).unwrap_or_default();
    Ok((id, status.leader()))
}

/// Sums a Prometheus metric over the samples whose labels contain all of `labels` (each
/// given as `name="value"`; none for a metric without labels).
#[must_use]
pub fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}
