//! The container harness (feature `containers`): an etcd cluster of containers on a
//! private Docker network, started with `testcontainers`, with the faults processes
//! cannot have: a member **partitioned** from the others (disconnected from the network)
//! and traffic **delayed** (`tc netem` inside the container).
//!
//! Images come from [`IMAGE_ENVS`]: `compose/build-local-images.sh` builds them from
//! Debian's packages where no registry can be reached. Every published port is bound to
//! 127.0.0.1. Dropping the cluster removes its containers and network.

use std::process::Command;
use std::time::Duration;

use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::time::Instant;

use super::TestkitError;
use super::etcd::status_leader;
use super::process::free_port;

/// Environment variable naming the etcd image (`name:tag`).
pub const ETCD_IMAGE_ENV: &str = "FENCELOCK_ETCD_IMAGE";
/// The image variables the compose file and this harness read.
pub const IMAGE_ENVS: [&str; 3] = [
    ETCD_IMAGE_ENV,
    "FENCELOCK_REDIS_IMAGE",
    "FENCELOCK_POSTGRES_IMAGE",
];
/// The etcd image when [`ETCD_IMAGE_ENV`] is unset: the local build.
pub const DEFAULT_ETCD_IMAGE: &str = "fencelock/etcd:local";

const START_TIMEOUT: Duration = Duration::from_secs(60);

struct Member {
    name: String,
    host_port: u16,
    container: ContainerAsync<GenericImage>,
}

/// A 3-member (or other size) etcd cluster in containers.
pub struct ContainerEtcdCluster {
    network: String,
    members: Vec<Member>,
}

impl std::fmt::Debug for ContainerEtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerEtcdCluster")
            .field("network", &self.network)
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl ContainerEtcdCluster {
    /// Starts `members` etcd containers on a fresh network and waits for a leader.
    pub async fn start(members: usize) -> Result<Self, TestkitError> {
        let image = std::env::var(ETCD_IMAGE_ENV).unwrap_or_else(|_| DEFAULT_ETCD_IMAGE.into());
        require_image(&image, ETCD_IMAGE_ENV)?;
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        let suffix = unique_suffix();
        let network = format!("fencelock-{suffix}");
        let names: Vec<String> = (0..members).map(|i| format!("etcd{i}-{suffix}")).collect();
        let initial_cluster = names
            .iter()
            .map(|n| format!("{n}=http://{n}:2380"))
            .collect::<Vec<_>>()
            .join(",");
        let mut started = Vec::new();
        for member in &names {
            let host_port = free_port().map_err(|e| TestkitError::io("finding a port", e))?;
            let container = GenericImage::new(name, tag)
                // A member cannot serve before its peers exist: wait for the leader
                // once all are started.
                .with_wait_for(WaitFor::Nothing)
                .with_container_name(member)
                .with_hostname(member)
                .with_network(&network)
                .with_cap_add("NET_ADMIN")
                .with_mapped_port(host_port, ContainerPort::Tcp(2379))
                .with_host_config_modifier(loopback_only)
                .with_startup_timeout(START_TIMEOUT)
                .with_cmd([
                    "etcd".to_owned(),
                    format!("--name={member}"),
                    "--data-dir=/var/lib/etcd-data".to_owned(),
                    "--listen-client-urls=http://0.0.0.0:2379".to_owned(),
                    format!("--advertise-client-urls=http://{member}:2379"),
                    "--listen-peer-urls=http://0.0.0.0:2380".to_owned(),
                    format!("--initial-advertise-peer-urls=http://{member}:2380"),
                    format!("--initial-cluster={initial_cluster}"),
                    "--initial-cluster-state=new".to_owned(),
                    format!("--initial-cluster-token={network}"),
                    // Short timeouts, as in the process harness, so failovers take
                    // fractions of a second.
                    "--heartbeat-interval=50".to_owned(),
                    "--election-timeout=500".to_owned(),
                ])
                .start()
                .await
                .map_err(|e| TestkitError::Cluster(format!("starting {member}: {e}")))?;
            started.push(Member {
                name: member.clone(),
                host_port,
                container,
            });
        }
        let cluster = Self {
            network,
            members: started,
        };
        cluster.wait_for_leader().await?;
        // A majority agreeing on a leader says nothing of the last member: until it has
        // caught up, its published port resets connections (docker's proxy finds nothing
        // listening behind it), and a test that reads its metrics fails (CI, f4e5b94).
        cluster.wait_for_every_member().await?;
        Ok(cluster)
    }

    /// Waits (up to 60 s) until every member answers a status request and knows a leader.
    async fn wait_for_every_member(&self) -> Result<(), TestkitError> {
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..self.members.len() {
            let endpoint = self.endpoint(i);
            loop {
                let probe = status_leader(&endpoint);
                match tokio::time::timeout(Duration::from_millis(500), probe).await {
                    Ok(Ok((_, leader))) if leader != 0 => break,
                    _ if Instant::now() >= deadline => {
                        return Err(TestkitError::Cluster(format!(
                            "member {i} does not serve with a leader"
                        )));
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }

    /// The client URL of member `i` (its published port on 127.0.0.1).
    #[must_use]
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].host_port)
    }

    /// The client URLs of all members.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// A lock configuration for this cluster with short timeouts, in `namespace`.
    pub fn config(&self, namespace: &str) -> crate::etcd::EtcdConfig {
        super::etcd::test_config(self.endpoints(), namespace)
    }

    /// The index of the member that reports itself leader, asking every member that
    /// answers; a member cut off from the others may still believe it leads, so only a
    /// leader that a majority agrees on counts.
    pub async fn leader(&self) -> Result<usize, TestkitError> {
        let mut ids = Vec::new();
        let mut votes: Vec<u64> = Vec::new();
        for i in 0..self.members.len() {
            let endpoint = self.endpoint(i);
            let probe = status_leader(&endpoint);
            if let Ok(Ok((id, leader))) =
                tokio::time::timeout(Duration::from_millis(500), probe).await
            {
                ids.push((i, id));
                votes.push(leader);
            }
        }
        let majority = self.members.len() / 2 + 1;
        votes
            .iter()
            .find(|leader| {
                **leader != 0 && votes.iter().filter(|v| v == leader).count() >= majority
            })
            .and_then(|leader| ids.iter().find(|(_, id)| id == leader).map(|(i, _)| *i))
            .ok_or_else(|| TestkitError::Cluster("no leader that a majority agrees on".into()))
    }

    /// Waits (up to 60 s) for a leader a majority agrees on.
    pub async fn wait_for_leader(&self) -> Result<usize, TestkitError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.leader().await {
                Ok(leader) => return Ok(leader),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Cuts member `i` off the network: no peer and no client reaches it, and it reaches
    /// no one (its published port goes with the network).
    pub fn partition(&self, i: usize) -> Result<(), TestkitError> {
        docker(&[
            "network",
            "disconnect",
            "-f",
            &self.network,
            &self.members[i].name,
        ])
    }

    /// Connects member `i` back, under its name.
    pub fn heal(&self, i: usize) -> Result<(), TestkitError> {
        let name = &self.members[i].name;
        docker(&["network", "connect", "--alias", name, &self.network, name])
    }

    /// Cuts member `i` off from its peers only (Raft traffic, port 2380, dropped both ways)
    /// while clients still reach it: a member in a minority that keeps answering clients,
    /// without a leader. iptables rules in its network namespace, entered from the host
    /// (`nsenter`; needs root, as CI runs).
    pub fn isolate_from_peers(&self, i: usize) -> Result<(), TestkitError> {
        self.peer_rules(i, "-A")
    }

    /// Undoes [`isolate_from_peers`](Self::isolate_from_peers).
    pub fn rejoin_peers(&self, i: usize) -> Result<(), TestkitError> {
        self.peer_rules(i, "-D")
    }

    fn peer_rules(&self, i: usize, action: &str) -> Result<(), TestkitError> {
        let name = &self.members[i].name;
        let pid = Command::new("docker")
            .args(["inspect", "-f", "{{.State.Pid}}", name])
            .output()
            .map_err(|e| TestkitError::io("running docker inspect", e))?;
        let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
        // Peer streams run both ways over connections either side opened: drop packets
        // to and from port 2380, in and out.
        for chain in ["INPUT", "OUTPUT"] {
            for port in ["--dport", "--sport"] {
                let output = Command::new("nsenter")
                    .args(["-t", &pid, "-n", "iptables", action, chain])
                    .args(["-p", "tcp", port, "2380", "-j", "DROP"])
                    .output()
                    .map_err(|e| TestkitError::io("running nsenter iptables (root needed)", e))?;
                if !output.status.success() {
                    return Err(TestkitError::Cluster(format!(
                        "iptables {action} {chain} {port} 2380 in {name}: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Delays every packet member `i` sends by `delay` (`tc netem`; needs the kernel's
    /// `sch_netem`).
    pub fn delay(&self, i: usize, delay: Duration) -> Result<(), TestkitError> {
        let delay = format!("{}ms", delay.as_millis());
        docker(&[
            "exec",
            &self.members[i].name,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "netem",
            "delay",
            &delay,
        ])
    }

    /// SIGKILLs member `i`'s container.
    pub async fn kill(&self, i: usize) -> Result<(), TestkitError> {
        self.members[i]
            .container
            .stop_with_timeout(Some(0))
            .await
            .map_err(|e| TestkitError::Cluster(format!("killing {}: {e}", self.members[i].name)))
    }

    /// Starts a killed member again with its data, and waits for a leader.
    pub async fn restart(&self, i: usize) -> Result<(), TestkitError> {
        self.members[i].container.start().await.map_err(|e| {
            TestkitError::Cluster(format!("restarting {}: {e}", self.members[i].name))
        })?;
        self.wait_for_leader().await.map(drop)
    }

    /// Freezes member `i` (`docker pause`: the cgroup freezer, like SIGSTOP).
    pub async fn pause(&self, i: usize) -> Result<(), TestkitError> {
        self.members[i]
            .container
            .pause()
            .await
            .map_err(|e| TestkitError::Cluster(format!("pausing {}: {e}", self.members[i].name)))
    }

    /// Unfreezes member `i`.
    pub async fn resume(&self, i: usize) -> Result<(), TestkitError> {
        self.members[i]
            .container
            .unpause()
            .await
            .map_err(|e| TestkitError::Cluster(format!("resuming {}: {e}", self.members[i].name)))
    }
}

/// Publishes every port on 127.0.0.1 only.
fn loopback_only(config: &mut testcontainers::bollard::models::HostConfig) {
    if let Some(bindings) = config.port_bindings.as_mut() {
        for binding in bindings.values_mut().flatten().flatten() {
            binding.host_ip = Some("127.0.0.1".into());
        }
    }
}

/// Fails with a message that says how to get `image` when this machine does not have it:
/// no registry is reachable from here or from CI, so a missing image would otherwise end
/// in a pull error that names neither the script nor the variable.
pub fn require_image(image: &str, env_var: &str) -> Result<(), TestkitError> {
    let present = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .output()
        .map_err(|e| TestkitError::io("running docker", e))?
        .status
        .success();
    if present {
        return Ok(());
    }
    Err(TestkitError::Cluster(format!(
        "the image {image} is not on this machine, and none can be pulled: build the local \
         images with `bash compose/build-local-images.sh` (then `set -a; . \
         compose/local-images.env; set +a`), or name an image this machine has in {env_var}"
    )))
}

fn docker(args: &[&str]) -> Result<(), TestkitError> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| TestkitError::io("running docker", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestkitError::Cluster(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Names for this cluster's network and containers that no other run uses.
fn unique_suffix() -> String {
    let mut bytes = [0u8; 6];
    if getrandom::fill(&mut bytes).is_err() {
        return format!("{}-{}", std::process::id(), free_port().unwrap_or(0));
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
