//! A seeded fault soak of the ZooKeeper lock: clients on a 3-member ensemble whose every
//! path (each client to each member, each member to each other's quorum port) goes
//! through a fault proxy, while a nemesis cuts and freezes clients, cuts followers off
//! from the leader, pauses members (SIGSTOP) and kills and restarts them, one fault at a
//! time on a schedule drawn from the seed. Then a checker compares what the clients were
//! told with one rule: for each lock name, ordered by token, every holder's belief that it
//! holds the lock (from its grant until its guard reported the loss, or until it sent its
//! release) ended before the next holder was granted it, and tokens grow with the grants.
//!
//! Times are observed by the clients' tasks on one monotonic clock, after the fact: a
//! belief's end is recorded when its task saw `lost()` resolve, later than the deadline
//! itself, so scheduling delays err towards reporting a violation, never towards hiding
//! one.
//!
//! The seed is drawn afresh each run and printed; `FENCELOCK_ZK_SOAK_SEED=<n>` repeats
//! a schedule (the timing does not always repeat), `FENCELOCK_ZK_SOAK_SECS` sets the
//! length (30 s by default).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fencelock::testkit::{FaultProxy, ZooKeeperCluster};
use fencelock::zookeeper::{ZooKeeperConfig, ZooKeeperLocker};
use fencelock::{LockBackend, LockGuard, LockOptions, LossReason};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{admin, namespace, within};

const CLIENTS: usize = 3;
const TASKS_PER_CLIENT: usize = 2;
const NAMES: [&str; 2] = ["a", "b"];

/// A small deterministic generator (xorshift64*): the schedule of choices repeats for a
/// seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// One grant as its holder saw it.
#[derive(Debug, Clone)]
struct Hold {
    name: &'static str,
    token: u64,
    holder: String,
    granted: Instant,
    /// When the holder stopped believing it holds the lock.
    believed_until: Instant,
    /// Why: a loss reason, or a release.
    ended_by: String,
}

/// Everything the soak saw, for the checker and the report.
#[derive(Debug, Default, Clone)]
struct History {
    holds: Vec<Hold>,
    errors: BTreeMap<String, usize>,
    faults: Vec<String>,
}

fn seed() -> u64 {
    std::env::var("FENCELOCK_ZK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}

fn length() -> Duration {
    std::env::var("FENCELOCK_ZK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zookeeper_lock_keeps_exclusion_under_a_seeded_fault_schedule() {
    let seed = seed();
    let length = length();
    eprintln!(
        "zookeeper fault soak: seed {seed}, {length:?} (FENCELOCK_ZK_SOAK_SEED={seed} repeats it)"
    );
    let cluster = ZooKeeperCluster::start_with_peer_links(3)
        .await
        .expect("ensemble");
    let ns = namespace("soak");
    let members = cluster.len();

    // Each client reaches each member through a proxy of its own.
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..CLIENTS {
        let mut mine = Vec::new();
        for m in 0..members {
            let upstream = cluster.address(m).parse().expect("member address");
            mine.push(FaultProxy::start(upstream).await.expect("client proxy"));
        }
        let hosts = mine
            .iter()
            .map(|p| p.address().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let config: ZooKeeperConfig = cluster
            .config(&ns)
            .with_hosts(hosts)
            .with_request_timeout(Duration::from_millis(500));
        lockers.push(Arc::new(
            ZooKeeperLocker::connect(config)
                .await
                .expect("client connects"),
        ));
        proxies.push(mine);
    }
    let proxies = Arc::new(proxies);
    let history = Arc::new(std::sync::Mutex::new(History::default()));
    let stop = Arc::new(AtomicBool::new(false));

    let mut tasks = JoinSet::new();
    for (c, locker) in lockers.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let rng = Rng::new(seed ^ ((c * TASKS_PER_CLIENT + t + 1) as u64) << 32);
            tasks.spawn(workload(
                format!("c{c}t{t}"),
                locker.clone(),
                rng,
                history.clone(),
                stop.clone(),
            ));
        }
    }
    let cluster = Arc::new(Mutex::new(cluster));
    let nemesis = tokio::spawn(nemesis(
        Rng::new(seed),
        cluster.clone(),
        proxies.clone(),
        history.clone(),
        Instant::now() + length,
    ));

    nemesis.await.expect("the nemesis");
    stop.store(true, Ordering::SeqCst);
    // Liveness: with every fault healed, each task finishes its cycle and stops (a wait
    // lasts at most 5 s, a hold at most 6 s, a release its request timeout).
    within(Duration::from_secs(30), "the clients to stop", async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a client task");
        }
    })
    .await;
    drop(lockers);

    // No node outlives its client: every session is closed or expires (the longest
    // session timeout is 2 s).
    let history = history.lock().expect("history").clone();
    let cluster = cluster.lock().await;
    let admin = admin(&cluster).await;
    for name in NAMES {
        let dir = format!("{ns}/{name}");
        if let Err(left) = nodes_gone(&admin, &dir, Duration::from_secs(10)).await {
            let holds: Vec<_> = history.holds.iter().filter(|h| h.name == name).collect();
            panic!(
                "seed {seed}: lock nodes left under {dir} 10 s after the run: {left:?}\n\
                 faults {:?}\nerrors {:?}\nholds of {name}: {holds:#?}",
                history.faults, history.errors
            );
        }
    }
    check(seed, &history);
}

/// Waits (by child watches) until `dir` has no children; else returns them, each with
/// its session and its creation zxid.
async fn nodes_gone(
    admin: &zookeeper_client::Client,
    dir: &str,
    limit: Duration,
) -> Result<(), Vec<String>> {
    let deadline = Instant::now() + limit;
    loop {
        let (children, watcher) = match admin.get_and_watch_children(dir).await {
            Ok((children, _, watcher)) => (children, watcher),
            Err(zookeeper_client::Error::NoNode) => return Ok(()),
            Err(err) => return Err(vec![format!("listing {dir}: {err}")]),
        };
        if children.is_empty() {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, watcher.changed())
            .await
            .is_err()
        {
            let mut left = Vec::new();
            for child in children {
                let path = format!("{dir}/{child}");
                let stat = admin.check_stat(&path).await.ok().flatten();
                left.push(match stat {
                    Some(stat) => format!(
                        "{child} (session {:#x}, czxid {})",
                        stat.ephemeral_owner, stat.czxid
                    ),
                    None => format!("{child} (gone meanwhile)"),
                });
            }
            return Err(left);
        }
    }
}

/// The rule of the module docs, per name; panics with the seed and the holds around a
/// violation. Also refuses a run too quiet to mean anything.
fn check(seed: u64, history: &History) {
    let mut ended = BTreeMap::new();
    for hold in &history.holds {
        *ended.entry(hold.ended_by.clone()).or_insert(0) += 1;
    }
    eprintln!(
        "zookeeper fault soak (seed {seed}): {} grants ({ended:?}), {} faults {:?}, errors {:?}",
        history.holds.len(),
        history.faults.len(),
        history.faults,
        history.errors
    );
    for name in NAMES {
        let mut holds: Vec<&Hold> = history.holds.iter().filter(|h| h.name == name).collect();
        holds.sort_by_key(|h| h.token);
        for pair in holds.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                a.token < b.token && a.granted < b.granted && a.believed_until <= b.granted,
                "seed {seed}: lock {name}: {} still believed it held token {} (or was granted \
                 later) when {} was granted token {}: overlap {:?}\n{a:?}\n{b:?}",
                a.holder,
                a.token,
                b.holder,
                b.token,
                a.believed_until.saturating_duration_since(b.granted)
            );
        }
    }
    assert!(
        history.holds.len() >= 20,
        "seed {seed}: only {} grants: the run proves little",
        history.holds.len()
    );
    assert!(
        history.faults.len() >= 4,
        "seed {seed}: only {} faults",
        history.faults.len()
    );
}

/// One client task: lock a random name with a random TTL, hold it for a while (or until
/// the guard reports a loss), release; record what it was told.
async fn workload(
    me: String,
    locker: Arc<ZooKeeperLocker>,
    mut rng: Rng,
    history: Arc<std::sync::Mutex<History>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let ttl = Duration::from_millis(if rng.below(2) == 0 { 1_000 } else { 2_000 });
        let options = LockOptions::new()
            .with_ttl(ttl)
            .with_wait_timeout(Duration::from_secs(5));
        let guard = match locker.lock(name, &options).await {
            Ok(guard) => guard,
            Err(err) => {
                // The error's kind: its variant's name.
                let kind = format!("{err:?}")
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap_or("?")
                    .to_owned();
                *history
                    .lock()
                    .expect("history")
                    .errors
                    .entry(kind)
                    .or_insert(0) += 1;
                // Pacing, not synchronisation: a client whose server is gone retries.
                tokio::time::sleep(rng.millis(20, 200)).await;
                continue;
            }
        };
        let granted = Instant::now();
        // Most holds are short (many grants); some outlast the TTL several times (kept by
        // the session's heartbeats), long enough for a fault to end the session under
        // them.
        let ttl_ms = ttl.as_millis() as u64;
        let hold_for = if rng.below(10) < 7 {
            rng.millis(0, 200)
        } else {
            rng.millis(ttl_ms, 3 * ttl_ms)
        };
        let lost = tokio::select! {
            reason = guard.lost() => Some(reason),
            () = tokio::time::sleep(hold_for) => None,
        };
        let believed_until = Instant::now();
        let ended_by = match lost {
            Some(reason) => loss_name(reason),
            None => "released".to_owned(),
        };
        let token = guard.token().get();
        history.lock().expect("history").holds.push(Hold {
            name,
            token,
            holder: me.clone(),
            granted,
            believed_until,
            ended_by,
        });
        let _ = guard.release().await;
    }
}

fn loss_name(reason: LossReason) -> String {
    format!("lost: {reason}")
}

/// One fault at a time, each for a random while, with quiet gaps between; everything
/// healed at the end.
async fn nemesis(
    mut rng: Rng,
    cluster: Arc<Mutex<ZooKeeperCluster>>,
    proxies: Arc<Vec<Vec<FaultProxy>>>,
    history: Arc<std::sync::Mutex<History>>,
    until: Instant,
) {
    let note = |what: String| history.lock().expect("history").faults.push(what);
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(200, 1_000)).await;
        let lasting = rng.millis(300, 4_000);
        match rng.below(6) {
            0 => {
                let c = rng.below(CLIENTS as u64) as usize;
                note(format!("client {c} cut off {lasting:?}"));
                proxies[c].iter().for_each(FaultProxy::cut);
                tokio::time::sleep(lasting).await;
                proxies[c].iter().for_each(FaultProxy::heal);
            }
            1 => {
                let c = rng.below(CLIENTS as u64) as usize;
                note(format!("client {c} frozen {lasting:?}"));
                proxies[c].iter().for_each(FaultProxy::pause);
                tokio::time::sleep(lasting).await;
                proxies[c].iter().for_each(FaultProxy::resume);
            }
            2 | 5 => {
                let cluster = cluster.lock().await;
                let Ok(leader) = cluster.leader().await else {
                    continue;
                };
                let follower = (leader + 1 + rng.below(2) as usize) % cluster.len();
                note(format!(
                    "follower {follower} cut off from leader {leader} {lasting:?}"
                ));
                let _ = cluster.cut_off_from_leader(follower, leader);
                tokio::time::sleep(lasting).await;
                let _ = cluster.heal_link(follower, leader);
            }
            3 => {
                let cluster = cluster.lock().await;
                let m = rng.below(cluster.len() as u64) as usize;
                note(format!("member {m} paused {lasting:?}"));
                if cluster.pause(m).is_ok() {
                    tokio::time::sleep(lasting).await;
                    cluster.resume(m).expect("resume the member");
                }
            }
            _ => {
                // 4
                let mut cluster = cluster.lock().await;
                let m = match cluster.leader().await {
                    Ok(leader) if rng.below(2) == 0 => leader,
                    _ => rng.below(cluster.len() as u64) as usize,
                };
                note(format!("member {m} killed {lasting:?}"));
                if cluster.kill(m).is_ok() {
                    tokio::time::sleep(lasting).await;
                    cluster.restart(m).await.expect("restart the member");
                }
            }
        }
    }
}
