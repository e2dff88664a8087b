//! Real ZooKeeper servers (Debian's `zookeeper` package, run on the JVM): a standalone
//! server or an ensemble, on free loopback ports in a temp dir.
//!
//! Each member runs `java ... org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`
//! with its own data dir, the admin server off, fsync off, and a 100 ms tick (so that
//! session timeouts from 200 ms to 60 s are granted). Readiness is the server's own
//! answer to the `srvr` four-letter command: `Mode: standalone`, `leader` or `follower`.
//!
//! [`ZooKeeperCluster::start_with_peer_links`] puts a [`FaultProxy`] on every member's
//! way to every other member's quorum port (the one a follower keeps its connection to
//! the leader on), so that a test can cut one follower off from the leader while it still
//! serves its clients.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::TestkitError;
use super::process::{ServerProcess, find_binary, free_port, log_tail};
use super::proxy::FaultProxy;
use crate::zookeeper::ZooKeeperConfig;

/// Environment variable that overrides the path of the `java` binary.
pub const JAVA_BIN_ENV: &str = "FENCELOCK_JAVA_BIN";
/// Environment variable that overrides the path of ZooKeeper's jar (its manifest names
/// the jars it needs).
pub const ZOOKEEPER_JAR_ENV: &str = "FENCELOCK_ZOOKEEPER_JAR";

const DEFAULT_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logger for the server's SLF4J, when installed (else it logs nothing).
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
const START_TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The server's tick: sessions are checked for expiry at this granularity, and the
/// smallest session timeout it grants is two ticks.
pub const TICK: Duration = Duration::from_millis(100);

/// The members' `maxSessionTimeout` unless a test asks for another.
const DEFAULT_MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// A running ZooKeeper server or ensemble for tests. Dropping it stops every member.
#[derive(Debug)]
pub struct ZooKeeperCluster {
    java: PathBuf,
    jar: PathBuf,
    members: Vec<Member>,
    /// `links[a][b]`: the proxy member `a` reaches member `b`'s quorum port through
    /// ([`start_with_peer_links`](Self::start_with_peer_links)); empty otherwise.
    links: Vec<Vec<Option<FaultProxy>>>,
    /// The members' `maxSessionTimeout`.
    max_session_timeout: Duration,
    // Last: removed after the processes are gone.
    dir: TempDir,
}

#[derive(Debug)]
struct Member {
    client_port: u16,
    peer_port: u16,
    election_port: u16,
    process: Option<ServerProcess>,
}

impl ZooKeeperCluster {
    /// Starts one standalone server.
    pub async fn single() -> Result<Self, TestkitError> {
        Self::start(1).await
    }

    /// Starts an ensemble of `members` servers (1 is a standalone server) and waits until
    /// every member serves (standalone, or leader and followers agreed). A port taken by
    /// someone else meanwhile is retried with fresh ports.
    pub async fn start(members: usize) -> Result<Self, TestkitError> {
        Self::start_with(members, false, DEFAULT_MAX_SESSION_TIMEOUT).await
    }

    /// Starts one standalone server that grants session timeouts of at most `max` (its
    /// `maxSessionTimeout`; 60 s otherwise): a server that lowers the TTL a client asks
    /// for, as a default one (`tickTime=2000`) does above 40 s.
    pub async fn single_with_max_session_timeout(max: Duration) -> Result<Self, TestkitError> {
        Self::start_with(1, false, max).await
    }

    /// Starts an ensemble as [`start`](Self::start) does, with every member's connection
    /// to every other member's quorum port going through a fault proxy of its own: see
    /// [`cut_off_from_leader`](Self::cut_off_from_leader). (Each member's `zoo.cfg` lists
    /// the others at its proxies: ZooKeeper reads the other members' addresses from the
    /// static configuration only.)
    pub async fn start_with_peer_links(members: usize) -> Result<Self, TestkitError> {
        Self::start_with(members, true, DEFAULT_MAX_SESSION_TIMEOUT).await
    }

    async fn start_with(
        members: usize,
        peer_links: bool,
        max_session_timeout: Duration,
    ) -> Result<Self, TestkitError> {
        if members == 0 {
            return Err(TestkitError::Cluster(
                "an ensemble needs at least one member".into(),
            ));
        }
        let java = find_binary("java", JAVA_BIN_ENV).ok_or(TestkitError::BinaryNotFound {
            binary: "java",
            package: "zookeeper",
            env_var: JAVA_BIN_ENV,
        })?;
        let jar = std::env::var_os(ZOOKEEPER_JAR_ENV)
            .map_or_else(|| PathBuf::from(DEFAULT_JAR), PathBuf::from);
        if !jar.is_file() {
            return Err(TestkitError::BinaryNotFound {
                binary: "zookeeper.jar",
                package: "zookeeper",
                env_var: ZOOKEEPER_JAR_ENV,
            });
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut cluster = Self::prepare(members, java.clone(), jar.clone())?;
            cluster.max_session_timeout = max_session_timeout;
            if peer_links {
                cluster.links = cluster.peer_links().await?;
            }
            match cluster.launch_all().await {
                Ok(()) => return Ok(cluster),
                Err(err) if attempt < 3 && cluster.lost_a_port() => {
                    tracing::debug!(%err, "port taken while starting zookeeper; retrying");
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// One standalone server for the whole process, started on first use (on a runtime
    /// of its own, so any test may call this), for tests that do not break it: a JVM
    /// takes about a second to start. It dies with the process; its files are removed
    /// when the process exits normally.
    ///
    /// # Panics
    ///
    /// If the server cannot be started (as a test's `expect` would).
    pub fn shared() -> &'static Self {
        static SERVER: std::sync::OnceLock<ZooKeeperCluster> = std::sync::OnceLock::new();
        extern "C" fn remove_files() {
            if let Some(server) = SERVER.get() {
                for member in &server.members {
                    if let Some(process) = &member.process {
                        let _ = process.signal(libc::SIGKILL);
                    }
                }
                let _ = std::fs::remove_dir_all(server.dir.path());
            }
        }
        SERVER.get_or_init(|| {
            let started = std::thread::spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| TestkitError::io("starting a runtime", e))?
                    .block_on(Self::single())
            })
            .join();
            match started {
                Ok(Ok(server)) => {
                    // SAFETY: registers a plain function with no arguments, once.
                    unsafe {
                        libc::atexit(remove_files);
                    }
                    server
                }
                Ok(Err(err)) => panic!("cannot start the shared ZooKeeper server: {err}"),
                Err(_) => panic!("the thread starting the shared ZooKeeper server panicked"),
            }
        })
    }

    fn prepare(members: usize, java: PathBuf, jar: PathBuf) -> Result<Self, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-zookeeper-")
            .tempdir()
            .map_err(|e| TestkitError::io("creating the zookeeper temp dir", e))?;
        let port = || free_port().map_err(|e| TestkitError::io("finding a port", e));
        let members = (0..members)
            .map(|_| {
                Ok(Member {
                    client_port: port()?,
                    peer_port: port()?,
                    election_port: port()?,
                    process: None,
                })
            })
            .collect::<Result<Vec<_>, TestkitError>>()?;
        Ok(Self {
            java,
            jar,
            members,
            links: Vec::new(),
            max_session_timeout: DEFAULT_MAX_SESSION_TIMEOUT,
            dir,
        })
    }

    /// A proxy for each member to each other member's quorum port.
    async fn peer_links(&self) -> Result<Vec<Vec<Option<FaultProxy>>>, TestkitError> {
        let mut links = Vec::new();
        for a in 0..self.members.len() {
            let mut from_a = Vec::new();
            for (b, member) in self.members.iter().enumerate() {
                from_a.push(if a == b {
                    None
                } else {
                    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], member.peer_port));
                    let proxy = FaultProxy::start(upstream)
                        .await
                        .map_err(|e| TestkitError::io("starting a peer-link proxy", e))?;
                    Some(proxy)
                });
            }
            links.push(from_a);
        }
        Ok(links)
    }

    async fn launch_all(&mut self) -> Result<(), TestkitError> {
        for i in 0..self.members.len() {
            self.launch(i)?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..self.members.len() {
            self.await_ready(i, deadline).await?;
        }
        Ok(())
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{}", i + 1))
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{}.log", i + 1))
    }

    fn write_config(&self, i: usize) -> Result<PathBuf, TestkitError> {
        let io = |what: &str, e| TestkitError::io(format!("{what} for zookeeper member {i}"), e);
        let dir = self.member_dir(i);
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| io("creating the data dir", e))?;
        let member = &self.members[i];
        let mut cfg = format!(
            "tickTime={tick}\ninitLimit=50\nsyncLimit=20\ndataDir={data}\n\
             clientPort={port}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout={min}\nmaxSessionTimeout={max}\n\
             admin.enableServer=false\nforceSync=no\n\
             4lw.commands.whitelist=srvr,ruok,mntr,cons,stat\n",
            tick = TICK.as_millis(),
            data = data.display(),
            port = member.client_port,
            min = (2 * TICK).as_millis(),
            max = self.max_session_timeout.as_millis(),
        );
        if self.members.len() > 1 {
            std::fs::write(data.join("myid"), format!("{}\n", i + 1))
                .map_err(|e| io("writing myid", e))?;
            for (j, other) in self.members.iter().enumerate() {
                let peer_port = match self.links.get(i).and_then(|from_i| from_i.get(j)) {
                    Some(Some(proxy)) => proxy.address().port(),
                    _ => other.peer_port,
                };
                let _ = writeln!(
                    cfg,
                    "server.{}=127.0.0.1:{}:{}",
                    j + 1,
                    peer_port,
                    other.election_port
                );
            }
        }
        let path = dir.join("zoo.cfg");
        std::fs::write(&path, cfg).map_err(|e| io("writing zoo.cfg", e))?;
        Ok(path)
    }

    fn launch(&mut self, i: usize) -> Result<(), TestkitError> {
        let cfg = self.write_config(i)?;
        let mut classpath = self.jar.display().to_string();
        if Path::new(SLF4J_SIMPLE).is_file() {
            classpath.push(':');
            classpath.push_str(SLF4J_SIMPLE);
        }
        let args = vec![
            "-Xms32m".into(),
            "-Xmx1g".into(),
            // A small heap and the serial collector: a test server holds little. (The
            // JIT is left whole: limiting it to C1 starts no faster, measured, and
            // would slow the bench's rows.)
            "-XX:+UseSerialGC".into(),
            "-Djava.net.preferIPv4Stack=true".into(),
            "-Dzookeeper.admin.enableServer=false".into(),
            "-cp".into(),
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
            cfg.display().to_string(),
        ];
        let process = ServerProcess::start(&self.java, &args, &self.log_path(i))
            .map_err(|e| TestkitError::io(format!("starting {}", self.java.display()), e))?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// Waits until member `i` serves clients (its `srvr` answer names its mode).
    async fn await_ready(&mut self, i: usize, deadline: Instant) -> Result<(), TestkitError> {
        loop {
            if self.mode(i).await.is_some() {
                return Ok(());
            }
            let exited = self.members[i]
                .process
                .as_mut()
                .is_none_or(ServerProcess::has_exited);
            if exited || Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    what: format!(
                        "zookeeper member {i} (port {})",
                        self.members[i].client_port
                    ),
                    waited: START_TIMEOUT,
                    log_tail: log_tail(&self.log_path(i), 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn lost_a_port(&self) -> bool {
        (0..self.members.len())
            .any(|i| log_tail(&self.log_path(i), 50).contains("Address already in use"))
    }

    /// Sends a four-letter command (`srvr`, `ruok`, `mntr`, `cons`, `stat`) to member `i`
    /// and returns its answer.
    pub async fn four_letter(&self, i: usize, command: &str) -> Result<String, TestkitError> {
        let port = self
            .members
            .get(i)
            .ok_or_else(|| TestkitError::Cluster(format!("no member {i}")))?
            .client_port;
        let io = |e| TestkitError::io(format!("sending {command} to member {i}"), e);
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            stream.write_all(command.as_bytes()).await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok(answer)
        };
        match tokio::time::timeout(PROBE_TIMEOUT, exchange).await {
            Ok(answer) => answer.map_err(io),
            Err(_) => Err(io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// Member `i`'s mode (`standalone`, `leader`, `follower`), if it serves clients.
    pub async fn mode(&self, i: usize) -> Option<String> {
        let answer = self.four_letter(i, "srvr").await.ok()?;
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
    }

    /// The index of the member that reports itself leader (or the standalone server).
    pub async fn leader(&self) -> Result<usize, TestkitError> {
        for i in 0..self.members.len() {
            if self.members[i].process.is_none() {
                continue;
            }
            if let Some("leader" | "standalone") = self.mode(i).await.as_deref() {
                return Ok(i);
            }
        }
        Err(TestkitError::Cluster(
            "no member reports itself leader".into(),
        ))
    }

    /// Number of members.
    #[must_use]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members (never true for a started ensemble).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The client address of member `i`, `127.0.0.1:port`.
    #[must_use]
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// The connect string of the whole ensemble, `host:port,host:port,...`.
    #[must_use]
    pub fn connect_string(&self) -> String {
        (0..self.members.len())
            .map(|i| self.address(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A lock configuration for this ensemble with short timeouts, in `namespace`
    /// (a bare name becomes `/name`).
    pub fn config(&self, namespace: &str) -> ZooKeeperConfig {
        let namespace = if namespace.starts_with('/') {
            namespace.to_owned()
        } else {
            format!("/{namespace}")
        };
        ZooKeeperConfig::new(self.connect_string())
            .with_namespace(namespace)
            .with_connect_timeout(Duration::from_secs(5))
            .with_request_timeout(Duration::from_secs(3))
    }

    /// A plain client session on the ensemble, for the tests' own reads and deletes.
    pub async fn client(&self) -> Result<zookeeper_client::Client, TestkitError> {
        zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&self.connect_string())
            .await
            .map_err(|e| TestkitError::Cluster(format!("connecting to zookeeper: {e}")))
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

    /// Member `i`'s data directory (`dataDir`): a test that restores a member from an
    /// older copy kills it, swaps this directory, and restarts it.
    #[must_use]
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.member_dir(i).join("data")
    }

    /// Starts a killed member again on its ports and data; waits until it serves.
    pub async fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        if i >= self.members.len() {
            return Err(TestkitError::Cluster(format!("no member {i}")));
        }
        if let Some(mut old) = self.members[i].process.take() {
            old.kill()
                .map_err(|e| TestkitError::io(format!("stopping member {i}"), e))?;
        }
        self.launch(i)?;
        self.await_ready(i, Instant::now() + START_TIMEOUT).await
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

    /// Cuts member `i` off from the leader `leader` (an ensemble started with
    /// [`start_with_peer_links`](Self::start_with_peer_links)): nothing passes on its
    /// connection to the leader's quorum port any more, in either direction, while it
    /// keeps serving its own clients until it notices (after `syncLimit` ticks, 2 s here).
    pub fn cut_off_from_leader(&self, i: usize, leader: usize) -> Result<(), TestkitError> {
        self.link(i, leader)?.cut();
        Ok(())
    }

    /// Ends [`cut_off_from_leader`](Self::cut_off_from_leader): member `i` reaches the
    /// leader again (on a new connection).
    pub fn heal_link(&self, i: usize, leader: usize) -> Result<(), TestkitError> {
        self.link(i, leader)?.heal();
        Ok(())
    }

    fn link(&self, from: usize, to: usize) -> Result<&FaultProxy, TestkitError> {
        self.links
            .get(from)
            .and_then(|from| from.get(to))
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                TestkitError::Cluster(format!(
                    "no peer link from member {from} to member {to} (started without \
                     start_with_peer_links?)"
                ))
            })
    }

    fn process(&self, i: usize) -> Result<&ServerProcess, TestkitError> {
        self.members
            .get(i)
            .and_then(|m| m.process.as_ref())
            .ok_or_else(|| TestkitError::Cluster(format!("member {i} is not running")))
    }
}
