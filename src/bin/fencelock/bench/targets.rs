//! What the benchmark runs against: local servers it starts itself, or given endpoints.

use std::time::Duration;

use fencelock::etcd::EtcdConfig;
use fencelock::redis::RedisConfig;
use fencelock::testkit::{
    EtcdCluster, EtcdClusterBuilder, MariaDbServer, PostgresServer, RedisServer, TestPki,
    ZooKeeperCluster,
};
use fencelock::zookeeper::ZooKeeperConfig;

use super::plan::Plan;
use super::{BenchArgs, BoxResult};

/// The servers to benchmark, and the local ones kept alive (and stopped) with it.
pub struct Targets {
    pub etcd: Option<Vec<String>>,
    /// Where etcd's metrics can be read (plaintext URLs).
    pub etcd_metrics: Vec<String>,
    /// TLS and credentials for the given endpoints.
    pub tls: crate::security::BackendTls,
    pub redis: Option<String>,
    pub redlock: Option<Vec<String>>,
    pub postgres: Option<String>,
    /// A `mysql://` URL, for the MariaDB fenced-write rows.
    pub mariadb: Option<String>,
    /// The ZooKeeper connect string.
    pub zookeeper: Option<String>,
    /// A local 3-member ensemble beside the standalone server; only when ZooKeeper is
    /// local.
    pub zookeeper_three: Option<ZooKeeperConfig>,
    pub embedded: bool,
    embedded_etcd: bool,
    /// A second local etcd serving mutual TLS (a throwaway PKI), for the TLS rows beside
    /// the plaintext ones; only when etcd is local.
    pub etcd_tls: Option<EtcdConfig>,
    /// A local 3-member cluster beside the single member, for the rows that show what
    /// the deployment users run costs; only when etcd is local and single.
    pub etcd_three: Option<EtcdConfig>,
    /// The 3-member cluster's client URLs, for the Go peer's rows on it.
    pub etcd_three_endpoints: Option<Vec<String>>,
    // Dropping these stops the local servers, also on error and Ctrl-C.
    _etcd: Option<EtcdCluster>,
    _etcd_tls: Option<(EtcdCluster, TestPki)>,
    _etcd_three: Option<EtcdCluster>,
    _redis: Vec<RedisServer>,
    _postgres: Option<PostgresServer>,
    _mariadb: Option<MariaDbServer>,
    _zookeeper: Vec<ZooKeeperCluster>,
}

impl Targets {
    /// Starts a local server for every selected backend that was given no endpoint.
    pub async fn prepare(args: &BenchArgs, plan: &Plan) -> BoxResult<Self> {
        let wants = |name: &str| plan.wants(name);
        let mut targets = Self {
            etcd: args.endpoints.etcd.clone(),
            etcd_metrics: args.endpoints.etcd.clone().unwrap_or_default(),
            tls: args.endpoints.tls.clone(),
            redis: args.endpoints.redis.clone(),
            redlock: args.endpoints.redlock.clone(),
            postgres: args.endpoints.postgres.clone(),
            mariadb: args.mariadb.clone(),
            zookeeper: args.endpoints.zookeeper.clone(),
            zookeeper_three: None,
            embedded: false,
            embedded_etcd: false,
            etcd_tls: None,
            etcd_three: None,
            etcd_three_endpoints: None,
            _etcd: None,
            _etcd_tls: None,
            _etcd_three: None,
            _redis: Vec::new(),
            _postgres: None,
            _mariadb: None,
            _zookeeper: Vec::new(),
        };
        // etcd (and Redis) are also the locks of the fenced-write workloads.
        if targets.etcd.is_none() && plan.needs("etcd") {
            let members = if args.cluster { 3 } else { 1 };
            eprintln!(
                "starting a local {members}-member etcd (fsync {})",
                on_off(args.fsync)
            );
            let cluster = local_etcd(args)
                .members(members)
                .fsync(args.fsync)
                .start()
                .await?;
            targets.etcd = Some(cluster.endpoints());
            targets.etcd_metrics = (0..cluster.len())
                .map(|i| cluster.admin_endpoint(i))
                .collect();
            targets._etcd = Some(cluster);
            targets.embedded = true;
            targets.embedded_etcd = true;
            if wants("etcd") && plan.side_clusters {
                eprintln!("starting a local etcd with mutual TLS, for the TLS rows");
                let pki = TestPki::generate()?;
                let client = pki.client_tls("bench")?;
                let tls = local_etcd(args)
                    .fsync(args.fsync)
                    .tls(pki.server_tls(true), client.clone())
                    .start()
                    .await?;
                targets.etcd_tls = Some(
                    EtcdConfig::new(tls.endpoints())
                        .with_namespace("bench")
                        .with_request_timeout(Duration::from_secs(10))
                        .with_tls(client),
                );
                targets._etcd_tls = Some((tls, pki));
                if members == 1 {
                    eprintln!("starting a local 3-member etcd, for the cluster rows");
                    let three = local_etcd(args)
                        .members(3)
                        .fsync(args.fsync)
                        .start()
                        .await?;
                    targets.etcd_three = Some(
                        EtcdConfig::new(three.endpoints())
                            .with_namespace("bench")
                            .with_request_timeout(Duration::from_secs(10)),
                    );
                    targets.etcd_three_endpoints = Some(three.endpoints());
                    targets._etcd_three = Some(three);
                }
            }
        }
        if targets.redis.is_none() && plan.needs("redis") {
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
        if targets.zookeeper.is_none() && wants("zookeeper") {
            let single = if plan.side_clusters {
                eprintln!(
                    "starting a local ZooKeeper, and a 3-member ensemble for the cluster rows"
                );
                let single = ZooKeeperCluster::single().await?;
                let three = ZooKeeperCluster::start(3).await?;
                targets.zookeeper_three = Some(zookeeper_config(&three.connect_string()));
                targets._zookeeper.push(three);
                single
            } else {
                eprintln!("starting a local ZooKeeper");
                ZooKeeperCluster::single().await?
            };
            targets.zookeeper = Some(single.connect_string());
            targets._zookeeper.push(single);
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
        if targets.mariadb.is_none() && wants("mariadb") {
            eprintln!("starting a local mariadbd");
            let server = MariaDbServer::start().await?;
            let database = server.create_database().await?;
            targets.mariadb = Some(server.url(&database));
            targets._mariadb = Some(server);
            targets.embedded = true;
        }
        Ok(targets)
    }

    pub fn etcd_config(&self, namespace: &str) -> BoxResult<Option<EtcdConfig>> {
        let Some(endpoints) = &self.etcd else {
            return Ok(None);
        };
        let config = EtcdConfig::new(endpoints.clone())
            .with_namespace(namespace)
            .with_request_timeout(Duration::from_secs(10));
        // Local servers are plaintext; TLS flags are for the endpoints given.
        if self.embedded_etcd {
            return Ok(Some(config));
        }
        Ok(Some(self.tls.etcd(config)?))
    }

    pub fn redis_config(&self, prefix: &str) -> Option<RedisConfig> {
        self.redis.as_ref().map(|url| {
            self.with_redis_tls(
                RedisConfig::new(url.clone())
                    .with_prefix(prefix)
                    .with_request_timeout(Duration::from_secs(5)),
            )
        })
    }

    pub fn redlock_config(&self, prefix: &str) -> Option<RedisConfig> {
        self.redlock.as_ref().map(|urls| {
            self.with_redis_tls(
                RedisConfig::masters(urls.clone())
                    .with_prefix(prefix)
                    .with_request_timeout(Duration::from_secs(5)),
            )
        })
    }

    pub fn zookeeper_config(&self) -> Option<ZooKeeperConfig> {
        self.zookeeper.as_deref().map(zookeeper_config)
    }

    fn with_redis_tls(&self, config: RedisConfig) -> RedisConfig {
        match self.tls.redis.tls() {
            Some(tls) => config.with_tls(tls),
            None => config,
        }
    }
}

fn zookeeper_config(hosts: &str) -> ZooKeeperConfig {
    ZooKeeperConfig::new(hosts)
        .with_namespace("/bench")
        .with_request_timeout(Duration::from_secs(10))
}

pub fn on_off(flag: bool) -> &'static str {
    if flag { "on" } else { "off" }
}

/// A local etcd of the binary the run asked for (`--etcd-bin`), or of `PATH`'s.
fn local_etcd(args: &BenchArgs) -> EtcdClusterBuilder {
    let builder = EtcdCluster::builder();
    match &args.etcd_bin {
        Some(path) => builder.binary(path),
        None => builder,
    }
}
