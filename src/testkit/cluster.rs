//! An etcd cluster from whichever harness [`HARNESS_ENV`] selects: processes (the default)
//! or containers (feature `containers`). Tests written against it run on both:
//! `FENCELOCK_HARNESS=containers cargo test --features containers --test etcd`.

use super::{EtcdCluster, TestkitError};
use crate::etcd::EtcdConfig;

/// Environment variable that selects the harness: `containers`, or `processes` (default).
pub const HARNESS_ENV: &str = "FENCELOCK_HARNESS";

/// An etcd cluster of processes or of containers, with the faults both can inject.
#[derive(Debug)]
#[non_exhaustive]
pub enum SelectedEtcdCluster {
    /// `etcd` processes on loopback ports.
    Processes(EtcdCluster),
    /// `etcd` containers on a private Docker network.
    #[cfg(feature = "containers")]
    Containers(super::ContainerEtcdCluster),
}

impl SelectedEtcdCluster {
    /// Starts `members` members with the harness [`HARNESS_ENV`] names.
    pub async fn start(members: usize) -> Result<Self, TestkitError> {
        match std::env::var(HARNESS_ENV).as_deref() {
            Err(_) | Ok("" | "processes") => Ok(Self::Processes(
                EtcdCluster::builder().members(members).start().await?,
            )),
            #[cfg(feature = "containers")]
            Ok("containers") => Ok(Self::Containers(
                super::ContainerEtcdCluster::start(members).await?,
            )),
            Ok(other) => Err(TestkitError::Cluster(format!(
                "{HARNESS_ENV}={other}: expected `processes` or `containers` (the latter \
                 needs the `containers` feature)"
            ))),
        }
    }

    /// The client URLs of all members.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Self::Processes(c) => c.endpoints(),
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.endpoints(),
        }
    }

    /// A lock configuration for this cluster with short timeouts, in `namespace`.
    pub fn config(&self, namespace: &str) -> EtcdConfig {
        super::etcd::test_config(self.endpoints(), namespace)
    }

    /// The index of the current leader.
    pub async fn leader(&self) -> Result<usize, TestkitError> {
        match self {
            Self::Processes(c) => c.leader().await,
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.leader().await,
        }
    }

    /// Waits until the running members agree on a leader.
    pub async fn wait_for_leader(&self) -> Result<usize, TestkitError> {
        match self {
            Self::Processes(c) => c.wait_for_leader().await,
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.wait_for_leader().await,
        }
    }

    /// SIGKILLs member `i`.
    pub async fn kill(&mut self, i: usize) -> Result<(), TestkitError> {
        match self {
            Self::Processes(c) => c.kill(i),
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.kill(i).await,
        }
    }

    /// Starts a killed member again with its data.
    pub async fn restart(&mut self, i: usize) -> Result<(), TestkitError> {
        match self {
            Self::Processes(c) => c.restart(i).await,
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.restart(i).await,
        }
    }

    /// Freezes member `i` (SIGSTOP, or the cgroup freezer for a container).
    pub async fn pause(&self, i: usize) -> Result<(), TestkitError> {
        match self {
            Self::Processes(c) => c.pause(i),
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.pause(i).await,
        }
    }

    /// Unfreezes member `i`.
    pub async fn resume(&self, i: usize) -> Result<(), TestkitError> {
        match self {
            Self::Processes(c) => c.resume(i),
            #[cfg(feature = "containers")]
            Self::Containers(c) => c.resume(i).await,
        }
    }
}
