//! Connection settings for the etcd backend.

use std::fmt;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::tls::LoadedTls;
use crate::{Backend, LockError, TlsConfig};

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
///
/// A cluster that requires mutual TLS:
///
/// ```
/// use fencelock::TlsConfig;
/// use fencelock::etcd::EtcdConfig;
///
/// let config = EtcdConfig::new(["https://10.0.0.1:2379", "https://10.0.0.2:2379"]).with_tls(
///     TlsConfig::new()
///         .with_ca_file("/etc/etcd/ca.pem")
///         .with_identity_files("/etc/etcd/locker.pem", "/etc/etcd/locker-key.pem"),
/// );
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone)]
#[must_use]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) namespace: String,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) max_batch: usize,
    pub(crate) max_in_flight: usize,
    pub(crate) own_transport: bool,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("namespace", &self.namespace)
            .field("max_batch", &self.max_batch)
            .field("max_in_flight", &self.max_in_flight)
            .field("own_transport", &self.own_transport)
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdConfig {
    /// Endpoints as `http://host:port`, `https://host:port` (TLS), or `host:port` (plaintext,
    /// or TLS when [`with_tls`](Self::with_tls) is set); any member of the cluster will do.
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
            tls: None,
            max_batch: super::batch::DEFAULT_MAX_BATCH,
            max_in_flight: super::batch::DEFAULT_MAX_IN_FLIGHT,
            own_transport: true,
        }
    }

    /// Connects with TLS: which CA to trust (default: the system's trust store), which
    /// client certificate to present (mutual TLS; with etcd's `--client-cert-auth` and
    /// auth enabled, its common name is the etcd user), which server name to expect.
    /// Endpoints must then be `https://` (or bare `host:port`). An `https://` endpoint
    /// without this uses TLS with the system's trust store.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long connecting (and the first request that proves the connection) may take.
    /// Default 5 s.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long any single request may take. Default 5 s. Long-lived streams (watches,
    /// keep-alives) are not cut by it. A request that is safe to repeat is retried after
    /// a timeout and while members are unreachable, so a request may take up to four of
    /// them, and opening a session (two lease grants at worst) eight, each plus up to half
    /// a second of pauses between attempts (see `docs/etcd.md`,
    /// "A leader's death costs a request one timeout").
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many operations one etcd transaction of joins and releases of *different*
    /// locks may carry (group commit: only requests that queue while another of the same
    /// session is in flight are batched; a lone request goes out at once, alone). A join
    /// counts 2 operations, a release 1. Default 128, etcd's default `--max-txn-ops`; a
    /// server with a lower limit refuses the batch, its members go alone, and batches
    /// shrink. 1 turns batching off. Locks taken in one batch share a fencing token value:
    /// a token orders the grants of one lock, not grants across locks.
    pub fn with_max_batch(mut self, max: usize) -> Self {
        self.max_batch = max;
        self
    }

    /// How many joins and releases (or batches of them) one session keeps in flight before
    /// the next ones queue for the next batch. Default 4: a process with a few tasks
    /// sends as it would without batching, and batches form once more are waiting; 1
    /// batches the most (every request that arrives while one is in flight waits for it).
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// How many joins and releases one session keeps in flight before the next queue.
    #[must_use]
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Whether the lock's key-value requests (joins, releases, reads of a queue) go over
    /// fencelock's own HTTP/2 connection (the default) rather than tonic's channel.
    /// It sends each request from its caller's task (tonic's hands it to two other tasks
    /// first): about a tenth more lock cycles at one and eight tasks on a 2-core machine,
    /// etcd without fsync (`docs/bench.md`). What changes besides: it keeps one
    /// connection, to one member at a time (tonic's balances requests over every
    /// member), and leaves it for another member when it fails, when the member answers
    /// `Unavailable`, or when a request is given up unanswered after 250 ms (or half the
    /// request timeout) with nothing answered on it for as long (`docs/etcd.md`). Used only
    /// with plaintext endpoints and without credentials (none in the URLs either); with
    /// TLS or a user, and for watches and lease keep-alives always, tonic's channel
    /// carries everything. `false` sends everything through tonic's channel.
    pub fn with_own_transport(mut self, on: bool) -> Self {
        self.own_transport = on;
        self
    }

    /// The members fencelock's own transport reaches (`host:port` each), if this
    /// configuration uses it (see [`with_own_transport`](Self::with_own_transport)).
    pub(crate) fn own_transport_endpoints(&self) -> Option<Vec<http::uri::Authority>> {
        if !self.own_transport
            || self.uses_tls()
            || self.credentials.is_some()
            || self.endpoints.is_empty()
        {
            return None;
        }
        self.endpoints
            .iter()
            .map(|endpoint| {
                let address = endpoint.strip_prefix("http://").unwrap_or(endpoint);
                let address = address.strip_suffix('/').unwrap_or(address);
                // A user in the URL (`http://user:password@host:port`) is tonic's to
                // handle (and never put into an error's text by this transport).
                if address.contains('@') {
                    return None;
                }
                // Without a port, tonic's default (80) applies: left to it.
                let authority: http::uri::Authority = address.parse().ok()?;
                authority.port_u16().map(|_| authority)
            })
            .collect()
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
    /// uses keys `<namespace>/orders/<lease>-<slot>`.
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
        let mut schemes = (false, false);
        for endpoint in &self.endpoints {
            let shown = crate::name::shorten(endpoint);
            let (scheme, address) = match endpoint.split_once("://") {
                Some(("http", rest)) => (Some(false), rest),
                Some(("https", rest)) => (Some(true), rest),
                Some((other, _)) => {
                    return fail(format!(
                        "endpoint {shown:?}: unsupported scheme {:?}; use http://host:port, \
                         https://host:port or host:port",
                        crate::name::shorten(other)
                    ));
                }
                None => (None, endpoint.as_str()),
            };
            // A root path ("http://host:2379/") is harmless; anything more is not etcd's.
            let address = address.strip_suffix('/').unwrap_or(address);
            let port_ok = address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if address.is_empty()
                || address.contains(char::is_whitespace)
                || address.contains('/')
                || !port_ok
            {
                return fail(format!(
                    "endpoint {shown:?} is not of the form http://host:port, https://host:port \
                     or host:port"
                ));
            }
            match scheme {
                Some(true) => schemes.1 = true,
                Some(false) => schemes.0 = true,
                None => {}
            }
        }
        if schemes.0 && schemes.1 {
            return fail(
                "endpoints mix http:// and https://: use one for the whole cluster".into(),
            );
        }
        if schemes.0 && self.tls.is_some() {
            return fail("TLS is configured, but the endpoints are http://: use https://".into());
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return fail("timeouts must be above zero".into());
        }
        if self.max_in_flight == 0 {
            return fail("max in flight 0: at least 1 request must be allowed out".into());
        }
        if self.max_batch == 0 {
            return fail(
                "max batch 0: at least 1 request per transaction (1 turns batching off)".into(),
            );
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

    /// Whether connections use TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        self.tls.is_some() || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }

    /// The TLS material, read and checked, if connections use TLS.
    pub(crate) fn loaded_tls(&self) -> Result<Option<LoadedTls>, LockError> {
        if !self.uses_tls() {
            return Ok(None);
        }
        self.tls
            .clone()
            .unwrap_or_default()
            .load(Backend::Etcd)
            .map(Some)
    }

    /// The client library's options: timeouts, keep-alive, require-leader, credentials and
    /// the TLS material of [`loaded_tls`](Self::loaded_tls).
    pub(crate) fn connect_options(&self, tls: Option<&LoadedTls>) -> ConnectOptions {
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
            // etcd's auth tokens expire (a simple token after `--auth-token-ttl` unused,
            // 300 s by default; a JWT at its `ttl`): a holder whose lease is renewed on a
            // stream makes no unary call for as long as it holds, and its release would be
            // refused as "invalid auth token" (etcd-client's default is not to refresh),
            // its key left blocking the lock. With this, a call refused for an invalid
            // token authenticates again and is sent once more (etcd-client `caller.rs`
            // `do_call`: only on `Unauthenticated`/"invalid auth token", which etcd
            // answers before applying anything, so the retry cannot apply twice).
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        if let Some(loaded) = tls {
            let mut tls = TlsOptions::new();
            tls = match &loaded.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_native_roots(),
            };
            if let Some((certificate, key)) = &loaded.identity {
                tls = tls.identity(Identity::from_pem(certificate, key));
            }
            if let Some(name) = &loaded.server_name {
                tls = tls.domain_name(name.clone());
            }
            options = options.with_tls(tls);
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_transport_only_for_plaintext_endpoints_without_credentials() {
        let plain = EtcdConfig::new(["http://127.0.0.1:2379/", "10.0.0.2:2379", "[::1]:2379"]);
        let endpoints: Vec<String> = plain
            .own_transport_endpoints()
            .expect("plaintext, no user")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(endpoints, ["127.0.0.1:2379", "10.0.0.2:2379", "[::1]:2379"]);
        let user = plain.clone().with_credentials("u", "p");
        assert!(user.own_transport_endpoints().is_none());
        let off = plain.with_own_transport(false);
        assert!(off.own_transport_endpoints().is_none());
        let https = EtcdConfig::new(["https://127.0.0.1:2379"]);
        assert!(https.own_transport_endpoints().is_none());
        let tls = EtcdConfig::new(["127.0.0.1:2379"]).with_tls(TlsConfig::new());
        assert!(tls.own_transport_endpoints().is_none());
        let userinfo = EtcdConfig::new(["http://u:p@127.0.0.1:2379"]);
        assert!(userinfo.own_transport_endpoints().is_none());
        let no_port = EtcdConfig::new(["http://etcd"]);
        assert!(no_port.own_transport_endpoints().is_none());
    }

    #[test]
    fn accepts_usual_endpoints() {
        let config = EtcdConfig::new(["http://127.0.0.1:2379", "localhost:2380"]);
        assert!(config.validate().is_ok());
        let tls = EtcdConfig::new(["https://127.0.0.1:2379/", "localhost:2380"]);
        assert!(tls.validate().is_ok());
    }

    #[test]
    fn refuses_other_schemes_and_mixed_ones() {
        for endpoints in [
            vec!["ftp://127.0.0.1:2379"],
            vec!["http://127.0.0.1:2379/v3"],
            vec!["http://127.0.0.1:2379", "https://127.0.0.1:2380"],
        ] {
            let err = EtcdConfig::new(endpoints.clone())
                .validate()
                .expect_err("refused");
            assert!(err.is_invalid_input(), "{endpoints:?}: {err}");
        }
        let err = EtcdConfig::new(["http://127.0.0.1:2379"])
            .with_tls(TlsConfig::new())
            .validate()
            .expect_err("TLS with http://");
        assert!(err.to_string().contains("https://"), "{err}");
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
