//! A compose project for a test: the deployment of `compose/docker-compose.yml` on the local
//! images and free loopback ports, brought down (with its volumes) when dropped.

use std::process::Command;
use std::time::{Duration, Instant};

use fencelock::testkit::{free_port, require_image};

/// `docker compose` (v2) if the engine has it, else `docker-compose` (v1).
fn compose() -> Command {
    let v2 = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if v2 {
        let mut command = Command::new("docker");
        command.arg("compose");
        command
    } else {
        Command::new("docker-compose")
    }
}

/// Brings the project down (containers and volumes) when the test ends, however it ends.
pub struct Project {
    name: String,
    files: Vec<&'static str>,
    env: Vec<(String, String)>,
}

impl Project {
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = compose();
        command.args(["-p", &self.name]);
        for file in &self.files {
            command.args(["-f", file]);
        }
        command
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        command
    }

    /// The host port set in `var`.
    pub fn port(&self, var: &str) -> &str {
        &self.env.iter().find(|(k, _)| k == var).expect("port set").1
    }

    /// Waits until every container of the project reports healthy (Docker runs the
    /// health checks; there is no event to wait on from here).
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ids = self.command(&["ps", "-q"]).output().expect("compose ps");
            let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            let states = Command::new("docker")
                .args(["inspect", "-f", "{{.Name}} {{.State.Health.Status}}"])
                .args(&ids)
                .output()
                .expect("docker inspect");
            let states = String::from_utf8_lossy(&states.stdout).to_string();
            if ids.len() == 9 && states.lines().all(|l| l.ends_with(" healthy")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not healthy in {within:?}:\n{states}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self.command(&["down", "-v", "--timeout", "1"]).output();
    }
}

/// Brings a fresh project up and waits until every service is healthy.
pub fn up() -> Project {
    up_with(&[], Vec::new())
}

/// [`up`] with overlay compose files (after the main one) and more environment.
pub fn up_with(overlays: &[&'static str], extra: Vec<(String, String)>) -> Project {
    let mut env: Vec<(String, String)> = fencelock::testkit::IMAGE_ENVS
        .iter()
        .map(|var| {
            let server = var
                .trim_start_matches("FENCELOCK_")
                .trim_end_matches("_IMAGE")
                .to_lowercase();
            let local = format!("fencelock/{server}:local");
            let image = std::env::var(var).unwrap_or(local);
            if let Err(err) = require_image(&image, var) {
                panic!("{err}");
            }
            ((*var).to_owned(), image)
        })
        .collect();
    for var in PORTS {
        env.push((var.into(), free_port().expect("port").to_string()));
    }
    env.extend(extra);
    let mut files = vec!["compose/docker-compose.yml"];
    files.extend_from_slice(overlays);
    let project = Project {
        files,
        name: format!(
            "fencelock-test-{}-{}",
            std::process::id(),
            free_port().expect("port")
        ),
        env,
    };
    let up = project.command(&["up", "-d"]).output().expect("compose up");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    project.wait_healthy(Duration::from_secs(120));
    project
}

impl Project {
    /// The container id of `service`.
    pub fn container(&self, service: &str) -> String {
        let output = self
            .command(&["ps", "-q", service])
            .output()
            .expect("compose ps");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

const PORTS: [&str; 9] = [
    "FENCELOCK_ETCD1_PORT",
    "FENCELOCK_ETCD2_PORT",
    "FENCELOCK_ETCD3_PORT",
    "FENCELOCK_REDIS_PORT",
    "FENCELOCK_REDIS_REPLICA_PORT",
    "FENCELOCK_SENTINEL1_PORT",
    "FENCELOCK_SENTINEL2_PORT",
    "FENCELOCK_SENTINEL3_PORT",
    "FENCELOCK_POSTGRES_PORT",
];

/// Adds (`-A`) or deletes (`-D`) an iptables rule inside `container`'s network namespace,
/// from the host (`nsenter`; needs root): the images carry no iptables, and a rule there
/// leaves the container on its network, so its name keeps resolving for its peers.
pub fn netns_iptables(container: &str, rule: &[&str]) {
    let pid = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", container])
        .output()
        .expect("docker inspect");
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
    let output = Command::new("nsenter")
        .args(["-t", &pid, "-n", "iptables"])
        .args(rule)
        .output()
        .expect("nsenter iptables");
    assert!(
        output.status.success(),
        "iptables {}: {}",
        rule.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}
