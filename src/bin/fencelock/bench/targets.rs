//! What the benchmark runs against: local servers it starts itself, or given endpoints.

use std::time::Duration;

use fencelock::etcd::EtcdConfig;
use fencelock::redis::RedisConfig;
use fencelock::testkit::{EtcdCluster, PostgresServer, RedisServer};

use super::{BenchArgs, BoxResult};

/// The servers to benchmark, and the local ones kept alive (and stopped) with it.
pub struct Targets {
    pub etcd: Option<Vec<String>>,
    pub redis: Option<String>,
    pub redlock: Option<Vec<String>>,
    pub postgres: Option<String>,
    pub embedded: bool,
    // Dropping these stops the local servers, also on error and Ctrl-C.
    _etcd: Option<EtcdCluster>,
    _redis: Vec<RedisServer>,
    _postgres: Option<PostgresServer>,
}

impl Targets {
    /// Starts a local server for every selected backend that was given no endpoint.
    pub async fn prepare(args: &BenchArgs) -> BoxResult<Self> {
        let wants = |name: &str| args.backends.iter().any(|b| b == name);
        let mut targets = Self {
            etcd: args.endpoints.etcd.clone(),
            redis: args.endpoints.redis.clone(),
            redlock: args.endpoints.redlock.clone(),
            postgres: args.endpoints.postgres.clone(),
            embedded: false,
            _etcd: None,
            _redis: Vec::new(),
            _postgres: None,
        };
        // etcd is also the lock of the fenced-write workload.
        if targets.etcd.is_none() && (wants("etcd") || wants("postgres")) {
            let members = if args.cluster { 3 } else { 1 };
            eprintln!(
                "starting a local {members}-member etcd (fsync {})",
                on_off(args.fsync)
            );
            let cluster = EtcdCluster::builder()
                .members(members)
                .fsync(args.fsync)
                .start()
                .await?;
            targets.etcd = Some(cluster.endpoints());
            targets._etcd = Some(cluster);
            targets.embedded = true;
        }
        if targets.redis.is_none() && (wants("redis") || wants("postgres")) {
            eprintln!("starting a local redis-server");
            let server = RedisServer::start().await?;
            targets.redis = Some(server.url());
            targets._redis.push(server);
            targets.embedded = true;
        }
        if targets.redlock.is_none() && wants("redlock") {
            eprintln!("starting 3 local redis-server masters for Redlock");
            let mut urls = Vec::new();
            for _ in 0..3 {
                let server = RedisServer::start().await?;
                urls.push(server.url());
                targets._redis.push(server);
            }
            targets.redlock = Some(urls);
            targets.embedded = true;
        }
        if targets.postgres.is_none() && wants("postgres") {
            eprintln!("starting a local postgres");
            let server = PostgresServer::start().await?;
            let database = server.create_database().await?;
            targets.postgres = Some(server.connection_string(&database));
            targets._postgres = Some(server);
            targets.embedded = true;
        }
        Ok(targets)
    }

    pub fn etcd_config(&self, namespace: &str) -> Option<EtcdConfig> {
        self.etcd.as_ref().map(|endpoints| {
            EtcdConfig::new(endpoints.clone())
                .with_namespace(namespace)
                .with_request_timeout(Duration::from_secs(10))
        })
    }

    pub fn redis_config(&self, prefix: &str) -> Option<RedisConfig> {
        self.redis.as_ref().map(|url| {
            RedisConfig::new(url.clone())
                .with_prefix(prefix)
                .with_request_timeout(Duration::from_secs(5))
        })
    }

    pub fn redlock_config(&self, prefix: &str) -> Option<RedisConfig> {
        self.redlock.as_ref().map(|urls| {
            RedisConfig::masters(urls.clone())
                .with_prefix(prefix)
                .with_request_timeout(Duration::from_secs(5))
        })
    }
}

pub fn on_off(flag: bool) -> &'static str {
    if flag { "on" } else { "off" }
}
