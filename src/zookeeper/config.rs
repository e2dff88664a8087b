//! Connection settings for the ZooKeeper backend.

use std::time::Duration;

use crate::{Backend, LockError};

/// Where the ZooKeeper ensemble is, where the locks live in its tree, and how long to wait
/// for it.
///
/// ```
/// use std::time::Duration;
/// use fencelock::zookeeper::ZooKeeperConfig;
///
/// let config = ZooKeeperConfig::new("zk1:2181,zk2:2181,zk3:2181")
///     .with_namespace("/billing/locks")
///     .with_request_timeout(Duration::from_secs(2));
/// assert_eq!(config.namespace(), "/billing/locks");
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ZooKeeperConfig {
    pub(crate) hosts: String,
    pub(crate) namespace: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
}

impl ZooKeeperConfig {
    /// An ensemble, as ZooKeeper's connect string: `host:port[,host:port...]` (no chroot
    /// suffix: use [`with_namespace`](Self::with_namespace)).
    pub fn new(hosts: impl Into<String>) -> Self {
        Self {
            hosts: hosts.into(),
            namespace: "/fencelock".into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// The node under which every lock has its own node, `<namespace>/<name>` (default
    /// `/fencelock`). Curator's `InterProcessMutex` on `<namespace>/<name>` shares the
    /// queue (the node names follow its protected-mode format).
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Another connect string (the same namespace and timeouts).
    pub fn with_hosts(mut self, hosts: impl Into<String>) -> Self {
        self.hosts = hosts.into();
        self
    }

    /// How long establishing a session may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may go unanswered (default 5 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The connect string.
    #[must_use]
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The namespace node.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn validate(&self) -> Result<(), LockError> {
        let invalid = |reason: String| LockError::InvalidConfig {
            backend: Backend::ZooKeeper,
            reason,
        };
        if self.hosts.trim().is_empty() {
            return Err(invalid("no hosts in the connect string".into()));
        }
        if self.hosts.contains('/') {
            return Err(invalid(format!(
                "connect string {:?} carries a path: set the namespace instead",
                self.hosts
            )));
        }
        let ns = &self.namespace;
        let well_formed = ns.starts_with('/')
            && ns.len() > 1
            && !ns.ends_with('/')
            && !ns.contains("//")
            && ns
                .split('/')
                .skip(1)
                .all(|part| part != "." && part != "..");
        if !well_formed {
            return Err(invalid(format!(
                "namespace {ns:?} is not an absolute ZooKeeper path like /fencelock"
            )));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(invalid("zero connect or request timeout".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_must_be_absolute_paths() {
        for ns in ["fencelock", "/", "/a/", "/a//b", "/a/../b"] {
            let config = ZooKeeperConfig::new("127.0.0.1:2181").with_namespace(ns);
            assert!(config.validate().is_err(), "{ns}");
        }
        assert!(ZooKeeperConfig::new("127.0.0.1:2181").validate().is_ok());
        assert!(
            ZooKeeperConfig::new("127.0.0.1:2181/chroot")
                .validate()
                .is_err()
        );
        assert!(ZooKeeperConfig::new(" ").validate().is_err());
    }
}
