//! Connection settings for the etcd backend.

use std::fmt;
use std::time::Duration;

use etcd_client::ConnectOptions;

use crate::{Backend, LockError};

/// Where etcd is and how to talk to it.
///
/// ```
/// use std::time::Duration;
/// use fencelock::etcd::EtcdConfig;
///
/// let config = EtcdConfig::new(["http://127.0.0.1:2379"])
///     .with_namespace("billing/locks")
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_request_timeout(Duration::from_secs(3))
///     .with_credentials("billing", "s3cret");
/// assert_eq!(config.namespace(), "billing/locks");
/// // The password never shows up in logs.
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
#[must_use]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) namespace: String,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl EtcdConfig {
    /// Endpoints as `http://host:port` (or `host:port`); any member of the cluster will do.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            credentials: None,
            namespace: "fencelock".to_owned(),
        }
    }

    /// How long connecting (and the first request that proves the connection) may take.
    /// Default 5 s.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long any single request may take. Default 5 s. Long-lived streams (watches,
    /// keep-alives) are not cut by it.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Authenticates as `user` (etcd's built-in user/password auth).
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// The key prefix under which all lock keys live (default `fencelock`): lock `orders`
    /// uses keys `<namespace>/orders/<lease>-<seq>`.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The configured endpoints.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The per-request timeout.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Checks everything that can be checked without a server.
    pub fn validate(&self) -> Result<(), LockError> {
        let fail = |reason: String| {
            Err(LockError::InvalidConfig {
                backend: Backend::Etcd,
                reason,
            })
        };
        if self.endpoints.is_empty() {
            return fail("no endpoints given".into());
        }
        for endpoint in &self.endpoints {
            let address = endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("https://"))
                .unwrap_or(endpoint);
            let port_ok = address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if address.is_empty() || address.contains(char::is_whitespace) || !port_ok {
                return fail(format!(
                    "endpoint {endpoint:?} is not of the form http://host:port"
                ));
            }
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return fail("timeouts must be above zero".into());
        }
        let ns = &self.namespace;
        if ns.is_empty() || ns.starts_with('/') || ns.ends_with('/') || ns.contains("//") {
            return fail(format!(
                "namespace {ns:?} must be non-empty, without leading, trailing or doubled '/'"
            ));
        }
        if ns.chars().any(char::is_control) {
            return fail(format!("namespace {ns:?} contains control characters"));
        }
        Ok(())
    }

    pub(crate) fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            // Detect a dead connection (a stopped or partitioned member) without waiting for
            // the kernel's TCP timeouts. Not more often than every 5 s: etcd's default
            // --grpc-keepalive-min-time, below which it answers pings with GOAWAY.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member without a leader (cut off into a minority) refuses requests and
            // cancels streams (watches, keep-alives) instead of serving them stale or
            // never: the client then retries on a member that has a leader. Without it, a
            // watch on such a member never sees the holder's delete, and its waiter
            // stalls for as long as the partition lasts.
            .with_require_leader(true);
        if let Some((user, password)) = &self.credentials {
            options = options.with_user(user.clone(), password.clone());
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_usual_endpoints() {
        let config = EtcdConfig::new(["http://127.0.0.1:2379", "localhost:2380"]);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn refuses_unusable_settings() {
        let no_endpoints = EtcdConfig::new(Vec::<String>::new());
        let malformed = EtcdConfig::new(["http://127.0.0.1"]);
        let bad_port = EtcdConfig::new(["127.0.0.1:99999"]);
        let bad_namespace = EtcdConfig::new(["127.0.0.1:2379"]).with_namespace("locks/");
        let zero_timeout = EtcdConfig::new(["127.0.0.1:2379"]).with_request_timeout(Duration::ZERO);
        for config in [
            no_endpoints,
            malformed,
            bad_port,
            bad_namespace,
            zero_timeout,
        ] {
            let err = config.validate().expect_err("must be refused");
            assert!(err.is_invalid_input(), "{err}");
        }
    }
}
