//! Where the locks live, for the commands that use a given lock service (`run`, `locks`):
//! the etcd endpoints, the Redis server, the ZooKeeper ensemble, the namespace, and TLS and credentials for each,
//! and the client configurations made from them.

use clap::Args;
use fencelock::etcd::EtcdConfig;
use fencelock::redis::RedisConfig;
use fencelock::zookeeper::ZooKeeperConfig;

/// `--etcd`, `--redis`, `--namespace` and the TLS flags of both services.
#[derive(Clone, Debug, Args)]
pub struct ServiceArgs {
    /// etcd endpoints, for --backend etcd (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        env = "FENCELOCK_ETCD"
    )]
    pub etcd: Vec<String>,
    /// The Redis server, for --backend redis (redis://[user:password@]host:port/,
    /// rediss:// for TLS; prefer the password in FENCELOCK_REDIS).
    #[arg(
        long,
        default_value = "redis://127.0.0.1:6379/",
        env = "FENCELOCK_REDIS",
        hide_env_values = true
    )]
    pub redis: String,
    /// Use Redis servers whose maxmemory-policy may evict keys (anything but noeviction),
    /// with a warning; refused by default: eviction can remove a held lock's key (two
    /// holders) or its token counter (tokens start again at 1).
    #[arg(long, env = "FENCELOCK_REDIS_ALLOW_EVICTION")]
    pub redis_allow_eviction: bool,
    /// The ZooKeeper ensemble, for --backend zookeeper (its connect string,
    /// host:port[,host:port...]; plaintext: the ZooKeeper backend has no TLS).
    #[arg(long, default_value = "127.0.0.1:2181", env = "FENCELOCK_ZOOKEEPER")]
    pub zookeeper: String,
    /// Key namespace (the key prefix on Redis; the node /<namespace> on ZooKeeper).
    #[arg(long, default_value = "fencelock")]
    pub namespace: String,
    #[command(flatten)]
    pub security: crate::security::EtcdSecurity,
    #[command(flatten)]
    pub redis_security: crate::security::RedisSecurity,
}

impl ServiceArgs {
    /// The etcd client configuration; an unusable TLS or credential flag is the error.
    pub fn etcd_config(&self) -> Result<EtcdConfig, String> {
        let config = EtcdConfig::new(self.etcd.clone()).with_namespace(&self.namespace);
        self.security.apply(config)
    }

    /// The ZooKeeper client configuration: the namespace becomes the node
    /// `/<namespace>` (kept as is if it starts with '/').
    pub fn zookeeper_config(&self) -> ZooKeeperConfig {
        let namespace = if self.namespace.starts_with('/') {
            self.namespace.clone()
        } else {
            format!("/{}", self.namespace)
        };
        ZooKeeperConfig::new(&self.zookeeper).with_namespace(namespace)
    }

    /// The Redis client configuration for `urls` (one server, or Redlock's masters).
    pub fn redis_config(&self, urls: impl IntoIterator<Item = String>) -> RedisConfig {
        let config = RedisConfig::masters(urls)
            .with_prefix(&self.namespace)
            .with_allow_eviction(self.redis_allow_eviction);
        match self.redis_security.tls() {
            Some(tls) => config.with_tls(tls),
            None => config,
        }
    }
}
