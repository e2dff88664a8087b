//! Connection settings for the Redis backends.

use std::time::Duration;

use ::redis::ConnectionAddr;

use crate::tls::LoadedTls;
use crate::{Backend, LockError, TlsConfig};

/// Where Redis is and how to talk to it; one URL per master for Redlock.
///
/// ```
/// use std::time::Duration;
/// use fencelock::redis::RedisConfig;
///
/// let config = RedisConfig::new("redis://127.0.0.1:6379/")
///     .with_prefix("billing")
///     .with_request_timeout(Duration::from_millis(500));
/// assert_eq!(config.prefix(), "billing");
/// ```
///
/// TLS with a private CA and a client certificate, as an ACL user (keep the password out
/// of code and command lines: read it from the environment or a file):
///
/// ```
/// use fencelock::TlsConfig;
/// use fencelock::redis::RedisConfig;
///
/// let password = std::env::var("REDIS_PASSWORD").unwrap_or_default();
/// let config = RedisConfig::new(format!("rediss://locker:{password}@redis.internal:6380/"))
///     .with_tls(
///         TlsConfig::new()
///             .with_ca_file("/etc/redis/ca.pem")
///             .with_identity_files("/etc/redis/client.pem", "/etc/redis/client-key.pem"),
///     );
/// assert!(!format!("{config:?}").contains(&format!(":{password}@")) || password.is_empty());
/// ```
#[derive(Clone)]
#[must_use]
pub struct RedisConfig {
    pub(crate) urls: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) prefix: String,
    pub(crate) max_wait_sleep: Duration,
    pub(crate) pubsub_ping_interval: Duration,
    pub(crate) clock_drift_factor: f64,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) allow_eviction: bool,
}

/// A URL as errors and `Debug` show it: its scheme and where it points (host and port,
/// or socket path, and database), read back from redis-rs's own parse, never its text (a
/// password may be in its user part or, for a unix socket, its query). One that does not
/// parse shows as such.
pub(super) fn shown(url: &str) -> String {
    let Ok(client) = ::redis::Client::open(url) else {
        return "(not a Redis URL)".to_owned();
    };
    let info = client.get_connection_info();
    let scheme = url.split_once("://").map_or("redis", |(scheme, _)| scheme);
    let db = info.redis_settings().db();
    let shown = match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{scheme}://{host}:{port}/{db}")
        }
        unix => format!("{scheme}://{unix}?db={db}"),
    };
    crate::name::shorten(&shown)
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry a password: show only where they point.
        let hosts: Vec<String> = self.urls.iter().map(|url| shown(url)).collect();
        f.debug_struct("RedisConfig")
            .field("urls", &hosts)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("prefix", &self.prefix)
            .field("max_wait_sleep", &self.max_wait_sleep)
            .field("pubsub_ping_interval", &self.pubsub_ping_interval)
            .field("tls", &self.tls)
            .field("allow_eviction", &self.allow_eviction)
            .finish()
    }
}

impl RedisConfig {
    /// One Redis server, as a `redis://[user:password@]host:port/[db]` URL
    /// (`rediss://` for TLS).
    pub fn new(url: impl Into<String>) -> Self {
        Self::masters([url])
    }

    /// Several independent masters, for [`RedlockLocker`](super::RedlockLocker). Each
    /// server once: connecting refuses one listed twice, which would count twice toward
    /// the quorum: by its address as written (in any database), and once connected by
    /// the `run_id` it reports (`INFO server`) or, where `INFO` is not allowed, by a
    /// marker key under the prefix that one name sees the other write. That catches two
    /// names of one server (an alias, a proxy, its TLS port).
    pub fn masters<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            prefix: "fencelock".into(),
            max_wait_sleep: Duration::from_secs(2),
            pubsub_ping_interval: Duration::from_secs(1),
            clock_drift_factor: 0.01,
            tls: None,
            allow_eviction: false,
        }
    }

    /// Connects with TLS (every URL must then be `rediss://`): which CA to trust (default:
    /// the system's trust store) and which client certificate to present. The server's
    /// certificate must be valid for the URL's host (a different server name cannot be
    /// set for Redis). A `rediss://` URL without this uses the system's trust store.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long reaching the servers may take (default 5 s); Redlock's check that its
    /// masters are distinct servers, once they are reached, gets as long again.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one command may take (default 2 s). It also finds a connection that died
    /// without closing: a command unanswered within it, then a `PING` unanswered within
    /// it too, and the connection is replaced by a new one (about twice this of failed
    /// commands; docs/redis.md, "When the loss is noticed").
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Prefix of every key and channel (default `fencelock`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a waiter sleeps between attempts when no release message arrives
    /// (default 2 s). Waiters normally wake on the release message; this bounds what a
    /// lost message costs. A waiter never sleeps past the holder's remaining TTL.
    pub fn with_max_wait_sleep(mut self, sleep: Duration) -> Self {
        self.max_wait_sleep = sleep;
        self
    }

    /// How often the pub/sub connection that carries release messages is checked with a
    /// `PING` while any waiter of this client waits (default 1 s); none is sent while
    /// nobody waits. A connection that died without closing (its host crashed behind the
    /// same address, a failover behind a VIP, a load balancer that dropped the flow) is
    /// found by a `PING` unanswered within the request timeout and replaced: at once if it
    /// had stayed up 5 s, else after a backoff of up to about 1.2 s (1 s, jittered up by at
    /// most a fifth). So it costs handoffs by sleep (each up to
    /// [`max_wait_sleep`](Self::with_max_wait_sleep)) for about this interval plus the
    /// request timeout, that backoff and the reopening (connect and subscribe, each bounded
    /// by its timeout), not every handoff for as long as the name has a waiter. A server
    /// that stalls longer than the request timeout (a fork, a slow script) has its pub/sub
    /// connections replaced too. At least 10 ms.
    pub fn with_pubsub_ping_interval(mut self, interval: Duration) -> Self {
        self.pubsub_ping_interval = interval;
        self
    }

    /// Accepts servers whose `maxmemory-policy` may evict keys (anything but
    /// `noeviction`), with a warning instead of [`LockError::UnsafeServer`] at connect
    /// (default: refused). Eviction can remove a held lock's key (two holders) or the
    /// token counter (tokens start again at 1: storage then refuses the rightful holder
    /// and may accept a stale one); only opt out for a server that never reaches its
    /// `maxmemory`.
    pub fn with_allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// The prefix of keys and channels.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The TLS material for `url`, read and checked, if it is reached over TLS.
    pub(crate) fn loaded_tls(
        &self,
        url: &str,
        backend: Backend,
    ) -> Result<Option<LoadedTls>, LockError> {
        if self.tls.is_none() && !url.starts_with("rediss://") {
            return Ok(None);
        }
        self.tls.clone().unwrap_or_default().load(backend).map(Some)
    }

    /// A client for `url`, with the TLS material of [`loaded_tls`](Self::loaded_tls).
    pub(crate) fn client(
        &self,
        url: &str,
        tls: Option<&LoadedTls>,
        backend: Backend,
    ) -> Result<::redis::Client, LockError> {
        let invalid = |err: ::redis::RedisError| LockError::InvalidConfig {
            backend,
            reason: err.to_string(),
        };
        let Some(loaded) = tls else {
            return ::redis::Client::open(url).map_err(invalid);
        };
        let certificates = ::redis::TlsCertificates {
            client_tls: loaded.identity.clone().map(|(client_cert, client_key)| {
                ::redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: loaded.ca.clone(),
        };
        ::redis::Client::build_with_tls(url, certificates).map_err(invalid)
    }

    pub(crate) fn validate(&self, backend: Backend) -> Result<(), LockError> {
        let fail = |reason: String| Err(LockError::InvalidConfig { backend, reason });
        if self.urls.is_empty() {
            return fail("no server URL given".into());
        }
        // Each master once: a server listed twice would count twice toward a Redlock
        // quorum, and one server could grant a lock alone. Told apart here by address as
        // written, the host's case aside; two names of one server are caught once
        // connected, by its run_id (`distinct_masters.rs`).
        let mut servers = std::collections::HashMap::new();
        for (i, url) in self.urls.iter().enumerate() {
            let shown = shown(url);
            let client = match ::redis::Client::open(url.as_str()) {
                Ok(client) => client,
                Err(err) => {
                    let n = self.urls.len();
                    return fail(format!("URL {} of {n} is not a Redis URL: {err}", i + 1));
                }
            };
            let address = match client.get_connection_info().addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    format!("{}:{port}", host.to_lowercase())
                }
                unix => unix.to_string(),
            };
            if let Some(first) = servers.insert(address, shown.clone()) {
                return fail(format!(
                    "{shown:?} and {first:?} are the same server: each Redlock master must \
                     be a server of its own"
                ));
            }
            if self.tls.is_some() && !url.starts_with("rediss://") {
                return fail(format!(
                    "TLS is configured, but {shown:?} is not a rediss:// URL"
                ));
            }
        }
        if self
            .tls
            .as_ref()
            .is_some_and(|tls| tls.server_name().is_some())
        {
            return fail(
                "Redis TLS checks the URL's host: a different server name cannot be set".into(),
            );
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return fail("timeouts must be above zero".into());
        }
        if self.max_wait_sleep < Duration::from_millis(10) {
            return fail("max_wait_sleep must be at least 10ms".into());
        }
        if self.pubsub_ping_interval < Duration::from_millis(10) {
            return fail("pubsub_ping_interval must be at least 10ms".into());
        }
        let prefix = &self.prefix;
        if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return fail(format!(
                "prefix {prefix:?} must be non-empty, without spaces"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unusable_settings() {
        for config in [
            RedisConfig::masters(Vec::<String>::new()),
            RedisConfig::new("http://127.0.0.1:6379"),
            RedisConfig::new("redis://127.0.0.1:6379").with_prefix(""),
            RedisConfig::new("redis://127.0.0.1:6379").with_request_timeout(Duration::ZERO),
            RedisConfig::new("redis://127.0.0.1:6379").with_pubsub_ping_interval(Duration::ZERO),
        ] {
            let err = config.validate(Backend::Redis).expect_err("refused");
            assert!(err.is_invalid_input(), "{err}");
        }
        assert!(
            RedisConfig::new("redis://127.0.0.1:6379/")
                .validate(Backend::Redis)
                .is_ok()
        );
    }

    #[test]
    fn one_server_listed_twice_is_refused_naming_both_without_passwords() {
        for urls in [
            ["redis://h:6379/", "redis://h:6379/2", "redis://other:6379/"],
            [
                "redis://h/",
                "redis://:secret@h:6379/",
                "redis://other:6379/",
            ],
            [
                "unix:///run/r.sock?pass=secret",
                "unix:///run/r.sock?pass=secret&db=1",
                "redis://o/",
            ],
            [
                "unix:///s?user=a@b&pass=secret",
                "redis+unix:///s?pass=se@cret",
                "redis://o/",
            ],
            [
                "redis://Redis-A:6379/",
                "redis://redis-a:6379/",
                "redis://o/",
            ],
        ] {
            let err = RedisConfig::masters(urls)
                .validate(Backend::Redlock)
                .expect_err("a server twice");
            assert!(err.is_invalid_input(), "{err}");
            let said = err.to_string();
            assert!(
                said.contains("same server") && !said.contains("secret"),
                "{said}"
            );
        }
        let distinct = ["redis://h:6379/", "redis://h:6380/", "rediss://other:6379/"];
        assert!(
            RedisConfig::masters(distinct)
                .validate(Backend::Redlock)
                .is_ok()
        );
    }

    #[test]
    fn debug_hides_passwords() {
        let config = RedisConfig::new("redis://user:hunter2@127.0.0.1:6379/");
        assert!(!format!("{config:?}").contains("hunter2"));
        for url in ["unix:///s?pass=hunter2", "unix:///s?user=a@b&pass=hunter2"] {
            let said = format!("{:?}", RedisConfig::new(url));
            assert!(
                !said.contains("hunter2") && said.contains("unix:///s"),
                "{said}"
            );
        }
    }

    #[test]
    fn errors_name_urls_without_their_passwords() {
        let err = RedisConfig::new("unix:///s?user=ops@site&pass=hunter2")
            .with_tls(TlsConfig::new())
            .validate(Backend::Redis)
            .expect_err("TLS needs rediss://");
        let said = err.to_string();
        assert!(
            said.contains("unix:///s") && !said.contains("hunter2"),
            "{said}"
        );
    }
}
