//! A fleet of `fencelock run` processes taking several locks at once, for 30 s, on etcd,
//! Redis and ZooKeeper (issue 37): four lanes start one `fencelock run` after another, two
//! taking {a, b} and {b, a}, two taking random subsets of eight names (one to four, in a
//! random order; a subset of one is a plain single lock). Every run must finish within its
//! bound (a deadlock would hold two lanes forever), no two runs may hold one name at once,
//! and each name's tokens must increase in the order its holders wrote them down.
//!
//! How a run sees an overlap: its command makes a directory per name it holds (`mkdir`
//! fails if the directory exists, that is if another run holds the name too) and removes
//! them before it ends; a failed `mkdir` fails the command, and so the run.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use fencelock::testkit::{EtcdCluster, RedisServer, ZooKeeperCluster};
use tokio::process::Command;
use tokio::time::Instant;

/// How long each backend's fleet runs (the 30 s).
const FLEET: Duration = Duration::from_secs(30);
/// A run that takes longer than this is stuck: with 4 lanes and sections of a few ms, a
/// run waits for at most three others.
const RUN_BOUND: Duration = Duration::from_secs(20);
const NAMES: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

/// The command every run executes: for each `name=token` of `FENCELOCK_TOKENS`, claim the
/// name's directory (or fail: someone else holds it) and append the token to the name's
/// log; hold for a moment; give the directories back.
fn section(dir: &Path) -> String {
    format!(
        "set -e; cd {dir}; pairs=$(echo \"$FENCELOCK_TOKENS\" | tr , ' '); \
         for pair in $pairs; do name=${{pair%%=*}}; mkdir held-$name; \
         echo ${{pair#*=}} >> log-$name; done; sleep 0.01; \
         for pair in $pairs; do rmdir held-${{pair%%=*}}; done",
        dir = dir.display()
    )
}

/// A small deterministic generator (xorshift), so that a failing subset can be replayed
/// from the lane's seed.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }

    /// One to four distinct names of the eight, in a random order.
    fn subset(&mut self) -> Vec<&'static str> {
        let mut names = NAMES.to_vec();
        let count = 1 + self.below(4);
        (0..count)
            .map(|_| names.swap_remove(self.below(names.len())))
            .collect()
    }
}

/// Runs the fleet: `command()` is `fencelock run` with the backend's flags, before the
/// locks. Returns how many runs finished.
async fn fleet(what: &str, command: impl Fn() -> Command + Clone + Send + 'static) -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = section(dir.path());
    let until = Instant::now() + FLEET;
    let lanes: Vec<_> = (0..4u64)
        .map(|lane| {
            let command = command.clone();
            let script = script.clone();
            let what = what.to_owned();
            tokio::spawn(async move {
                let mut random = Xorshift(0x9e37_79b9_7f4a_7c15 ^ (lane + 1));
                let mut runs = 0;
                while Instant::now() < until {
                    let names = match lane {
                        0 => vec!["a", "b"],
                        1 => vec!["b", "a"],
                        _ => random.subset(),
                    };
                    let mut run = command();
                    for name in &names {
                        run.args(["--lock", name]);
                    }
                    run.args(["--ttl", "5s", "--", "sh", "-c", &script]);
                    let status = tokio::time::timeout(RUN_BOUND, run.status())
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{what}: lane {lane}'s run of {names:?} is stuck (deadlock?)")
                        })
                        .expect("fencelock runs");
                    assert!(
                        status.success(),
                        "{what}: lane {lane}'s run of {names:?} failed ({status}): an overlap \
                         fails its mkdir"
                    );
                    runs += 1;
                }
                runs
            })
        })
        .collect();
    let mut total = 0;
    for lane in lanes {
        let runs = lane.await.expect("lane");
        assert!(runs > 0, "{what}: every lane ran");
        total += runs;
    }
    let mut granted = HashMap::new();
    for name in NAMES {
        let Ok(log) = std::fs::read_to_string(dir.path().join(format!("log-{name}"))) else {
            continue;
        };
        let tokens: Vec<u64> = log
            .lines()
            .map(|line| line.parse().expect("a token"))
            .collect();
        assert!(
            tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "{what}: {name}'s tokens increase from holder to holder: {tokens:?}"
        );
        granted.insert(name, tokens.len());
        assert!(
            !dir.path().join(format!("held-{name}")).exists(),
            "{what}: every run gave {name} back"
        );
    }
    // a and b are taken by every lane; the subsets reach the other names.
    assert!(granted.len() > 2, "{what}: the subsets ran: {granted:?}");
    eprintln!("{what}: {total} runs in {FLEET:?}, grants per name {granted:?}");
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_fleet_taking_several_locks_never_deadlocks_nor_overlaps() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let endpoints = etcd.endpoints();
    let runs = fleet("etcd", move || {
        crate::support::fencelock_run(&endpoints, "cli-fleet")
    })
    .await;
    assert!(runs >= 8, "etcd: {runs} runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_fleet_taking_several_locks_never_deadlocks_nor_overlaps() {
    let redis = RedisServer::start().await.expect("redis");
    let url = redis.url();
    let runs = fleet("redis", move || {
        crate::run_redis::fencelock_on("redis", std::slice::from_ref(&url), "cli-fleet")
    })
    .await;
    assert!(runs >= 8, "redis: {runs} runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_a_fleet_taking_several_locks_never_deadlocks_nor_overlaps() {
    let hosts = ZooKeeperCluster::shared().connect_string();
    let runs = fleet("zookeeper", move || {
        crate::run_zookeeper::fencelock_on("run", &hosts, "cli-fleet")
    })
    .await;
    assert!(runs >= 8, "zookeeper: {runs} runs");
}
