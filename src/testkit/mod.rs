//! A real-server harness: etcd, Redis, PostgreSQL and ZooKeeper processes on free loopback ports, and
//! the faults to inject.
//!
//! Enabled by the `testkit` feature. The crate's own tests use it, the CLI's benchmark and
//! chaos commands will, and so can your tests:
//!
//! ```no_run
//! use fencelock::testkit::EtcdCluster;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut cluster = EtcdCluster::builder().members(3).start().await?;
//! let leader = cluster.leader().await?;
//! cluster.kill(leader)?;                  // SIGKILL the leader
//! let new_leader = cluster.wait_for_leader().await?;
//! assert_ne!(leader, new_leader);
//! cluster.restart(leader).await?;         // it rejoins with its data
//! # Ok(()) }
//! ```
//!
//! Every process is stopped by its PID when its handle is dropped, and dies with the
//! process that started it even if that one is killed outright.

mod bare;
mod clock;
mod cluster;
pub mod conformance;
#[cfg(feature = "containers")]
mod containers;
mod etcd;
mod holders;
mod mariadb;
mod panicking_recorder;
mod peer;
mod pki;
mod postgres;
mod process;
mod proxy;
mod redis;
pub mod soak;
mod zookeeper;

pub use bare::{BareRedisCycle, acquire_shaped, bare_etcd_cycle, cpu_time};
pub use clock::{JumpingClock, LIBFAKETIME_ENV};
pub use cluster::{HARNESS_ENV, SelectedEtcdCluster};
#[cfg(feature = "containers")]
pub use containers::{
    ContainerEtcdCluster, DEFAULT_ETCD_IMAGE, ETCD_IMAGE_ENV, IMAGE_ENVS, require_image,
};
pub use etcd::{
    ETCD_BIN_ENV, EtcdCluster, EtcdClusterBuilder, compact_now, fetch_metrics, metric_sum,
};
pub use holders::{Holders, random_set};
pub use mariadb::{MARIADB_BIN_ENV, MariaDbServer};
pub use panicking_recorder::{PanicsOnCounter, lost_at_first_renewal};
pub use peer::{CURATOR_JAR_ENV, JAVAC_BIN_ENV, LockPeer, PYTHON_ENV, python_with_kazoo};
pub use pki::{CertPair, ServerTls, TestPki};
pub use postgres::{PG_BIN_DIR_ENV, PostgresServer};
pub use process::{ProcessOptions, ServerProcess, free_port};
pub use proxy::FaultProxy;
pub use redis::{REDIS_BIN_ENV, RedisServer};
pub use zookeeper::{JAVA_BIN_ENV, TICK, ZOOKEEPER_JAR_ENV, ZooKeeperCluster};

use std::time::Duration;

/// What can go wrong while running test servers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// The server binary is not installed.
    #[error(
        "`{binary}` not found on PATH: install the Debian/Ubuntu package `{package}` or set {env_var}"
    )]
    BinaryNotFound {
        /// The binary looked for.
        binary: &'static str,
        /// The package that provides it.
        package: &'static str,
        /// The variable that overrides its path.
        env_var: &'static str,
    },
    /// A process could not be started or signalled.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A server exited or did not become ready in time.
    #[error("{what} did not become ready within {waited:?}; last log lines:\n{log_tail}")]
    NotReady {
        /// Which server.
        what: String,
        /// How long we waited.
        waited: Duration,
        /// The end of its log.
        log_tail: String,
    },
    /// The cluster has no leader, or the member asked for does not exist or is down.
    #[error("{0}")]
    Cluster(String),
    /// A request to a test server failed.
    #[error("request to test server failed: {0}")]
    Request(#[from] etcd_client::Error),
}

impl TestkitError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
