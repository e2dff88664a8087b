//! The servers of one scenario run: fresh local ones the run may kill, or the endpoints
//! the user gave (for the scenarios whose faults hit only the clients).

use std::net::SocketAddr;

use fencelock::testkit::{EtcdCluster, FaultProxy, JumpingClock, RedisServer, ZooKeeperCluster};

use super::worker::ChaosBackend;
use crate::bench::BoxResult;
use crate::endpoints::Endpoints;

/// What a scenario needs from the lock service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Any deployment: the faults hit the clients only.
    Any,
    /// A local 3-member etcd cluster whose leader the run kills.
    EtcdCluster,
    /// A local Redis master and its replica, which the run promotes.
    RedisWithReplica,
    /// Three local Redlock masters, the second on a clock that can jump.
    RedlockWithClock,
    /// A local 3-member ZooKeeper ensemble whose leader the run kills.
    ZooKeeperEnsemble,
}

/// The lock service of one run.
pub struct Stage {
    /// What the workers connect to (Redis: master first, then the failover candidates).
    pub endpoints: Vec<String>,
    /// The endpoints were given (not started here): TLS flags apply to them.
    pub given: bool,
    /// TLS and credentials for the lock service and storage, as the workers get them.
    pub tls: crate::security::BackendTls,
    pub etcd: Option<EtcdCluster>,
    pub redis: Vec<RedisServer>,
    pub clock: Option<JumpingClock>,
    pub zookeeper: Option<ZooKeeperCluster>,
}

impl Stage {
    /// Starts (or points at) the servers; `Ok(Err(reason))` when the scenario cannot run
    /// on the given endpoints.
    pub async fn build(
        backend: ChaosBackend,
        topology: Topology,
        given: &Endpoints,
    ) -> BoxResult<Result<Self, String>> {
        let mut stage = Self {
            endpoints: Vec::new(),
            given: false,
            tls: crate::security::BackendTls::default(),
            etcd: None,
            redis: Vec::new(),
            clock: None,
            zookeeper: None,
        };
        let given_endpoints = match backend {
            ChaosBackend::Etcd => given.etcd.clone(),
            ChaosBackend::Redis | ChaosBackend::Naive => given.redis.clone().map(|u| vec![u]),
            ChaosBackend::Redlock => given.redlock.clone(),
            ChaosBackend::Zookeeper => given
                .zookeeper
                .as_ref()
                .map(|hosts| hosts.split(',').map(str::to_owned).collect()),
        };
        if let Some(endpoints) = given_endpoints {
            if topology != Topology::Any {
                return Ok(Err(
                    "needs servers the tool starts itself (it kills or skews them)".into(),
                ));
            }
            stage.endpoints = endpoints;
            stage.given = true;
            return Ok(Ok(stage));
        }
        match (backend, topology) {
            (ChaosBackend::Etcd, topology) => {
                let members = if topology == Topology::EtcdCluster {
                    3
                } else {
                    1
                };
                let cluster = EtcdCluster::builder().members(members).start().await?;
                stage.endpoints = cluster.endpoints();
                stage.etcd = Some(cluster);
            }
            (ChaosBackend::Redis, Topology::RedisWithReplica) => {
                let master = RedisServer::start().await?;
                let replica = RedisServer::start_replica_of(&master).await?;
                stage.endpoints = vec![master.url(), replica.url()];
                stage.redis = vec![master, replica];
            }
            (ChaosBackend::Redis | ChaosBackend::Naive, _) => {
                let server = RedisServer::start().await?;
                stage.endpoints = vec![server.url()];
                stage.redis = vec![server];
            }
            (ChaosBackend::Zookeeper, topology) => {
                let members = if topology == Topology::ZooKeeperEnsemble {
                    3
                } else {
                    1
                };
                let ensemble = ZooKeeperCluster::start(members).await?;
                stage.endpoints = (0..members).map(|i| ensemble.address(i)).collect();
                stage.zookeeper = Some(ensemble);
            }
            (ChaosBackend::Redlock, topology) => {
                let clock = match topology {
                    Topology::RedlockWithClock => Some(JumpingClock::new()?),
                    _ => None,
                };
                for i in 0..3 {
                    let server = match (&clock, i) {
                        (Some(clock), 1) => RedisServer::start_wrapped(&clock.wrapper()?).await?,
                        _ => RedisServer::start().await?,
                    };
                    stage.endpoints.push(server.url());
                    stage.redis.push(server);
                }
                stage.clock = clock;
            }
        }
        Ok(Ok(stage))
    }
}

/// One fault proxy per endpoint, and the endpoints rewritten to go through them.
pub async fn proxied(endpoints: &[String]) -> BoxResult<(Vec<FaultProxy>, Vec<String>)> {
    let mut proxies = Vec::new();
    let mut rewritten = Vec::new();
    for endpoint in endpoints {
        // ZooKeeper members are bare host:port.
        let Some((scheme, rest)) = endpoint.split_once("://") else {
            let upstream: SocketAddr = tokio::net::lookup_host(endpoint.as_str())
                .await?
                .next()
                .ok_or_else(|| format!("cannot resolve {endpoint}"))?;
            let proxy = FaultProxy::start(upstream).await?;
            rewritten.push(proxy.address().to_string());
            proxies.push(proxy);
            continue;
        };
        let (host_port, path) = rest.split_once('/').unwrap_or((rest, ""));
        let upstream: SocketAddr = tokio::net::lookup_host(host_port)
            .await?
            .next()
            .ok_or_else(|| format!("cannot resolve {host_port}"))?;
        let proxy = FaultProxy::start(upstream).await?;
        // Redis URLs end in a '/' (the database); etcd endpoints do not need one.
        let slash = if path.is_empty() && scheme.starts_with("http") {
            ""
        } else {
            "/"
        };
        rewritten.push(format!("{scheme}://{}{slash}{path}", proxy.address()));
        proxies.push(proxy);
    }
    Ok((proxies, rewritten))
}
