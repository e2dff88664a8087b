//! Which cells one `fencelock bench` run measures, and how long that will take: the quick
//! default (the headline rows of each backend, about two minutes on 2 cores) or `--full`
//! (every cell and bar). Pure logic: nothing here starts a server or reads a clock.

use std::time::Duration;

use serde::Serialize;

use super::BenchArgs;

/// The backends of a `--full` run when `--backends` is not given.
pub const FULL_BACKENDS: [&str; 6] = [
    "etcd",
    "redis",
    "redlock",
    "postgres",
    "zookeeper",
    "mariadb",
];
/// The backends of the quick run when `--backends` is not given: the headline peers
/// (PostgreSQL as the fenced write's storage).
pub const QUICK_BACKENDS: [&str; 4] = ["etcd", "redis", "zookeeper", "postgres"];

/// The quick run or the full one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The headline rows: the default.
    Quick,
    /// Every cell (`--full`).
    Full,
}

/// The run's cells, resolved from the flags: a scope's default wherever a flag was not
/// given, the flag wherever it was.
#[derive(Clone, Debug)]
pub struct Plan {
    pub scope: Scope,
    pub backends: Vec<String>,
    pub concurrency: Vec<usize>,
    pub waiters: Vec<usize>,
    pub duration: Duration,
    pub renewal_locks: usize,
    pub renewal_duration: Duration,
    pub wave_locks: usize,
    /// Sizes of the etcd rows that take several locks together: `lock_all` (one
    /// transaction) against the same names taken one by one.
    pub lock_all_sizes: Vec<usize>,
    /// etcd put and the bare acquire-transaction cycles beside etcd's Lock RPC.
    pub etcd_bare_ceilings: bool,
    /// The raw put row alone in a quick run (with `--fsync`: the ceiling a disk-bound
    /// lock is measured against, half the put rate of as many tasks).
    pub etcd_put_ceiling: bool,
    /// The mutual-TLS etcd and the 3-member etcd and ZooKeeper clusters beside the single
    /// servers (local servers only), and the connect rows.
    pub side_clusters: bool,
    /// Concurrencies of the ZooKeeper lock's distinct-key rows (quick: kazoo's one).
    pub zookeeper_concurrency: Vec<usize>,
    /// One-key rows of the backends other than etcd.
    pub contended_all: bool,
    /// PostgreSQL's advisory-lock rows; the quick run uses PostgreSQL only as the fenced
    /// write's storage.
    pub postgres_lock_rows: bool,
    /// The locks of the PostgreSQL fenced-write rows (each is run only where that lock's
    /// server is there: ZooKeeper's only when `zookeeper` is benched).
    pub fenced_locks: &'static [&'static str],
    /// The locks of the MariaDB fenced-write rows.
    pub mariadb_locks: &'static [&'static str],
    /// The backends of the renewal rows.
    pub renewal_backends: &'static [&'static str],
    /// etcd, ZooKeeper are started locally (not given as endpoints); `--cluster`.
    pub local_etcd: bool,
    pub local_zookeeper: bool,
    pub cluster: bool,
}

impl Plan {
    /// The plan of `args`: `--full` or the quick default, with every flag given kept.
    pub fn new(args: &BenchArgs) -> Self {
        let scope = if args.full { Scope::Full } else { Scope::Quick };
        Self::resolve(scope, args)
    }

    /// The plan `args` would have in `scope` (the quick run's header also says how long
    /// the full one takes).
    pub fn resolve(scope: Scope, args: &BenchArgs) -> Self {
        let full = scope == Scope::Full;
        let owned = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect();
        let backends = args.backends.clone().unwrap_or_else(|| {
            if full {
                owned(&FULL_BACKENDS)
            } else {
                owned(&QUICK_BACKENDS)
            }
        });
        let concurrency = args.concurrency.clone();
        let zookeeper_concurrency = if full || !concurrency.contains(&1) {
            concurrency.clone()
        } else {
            vec![1]
        };
        Self {
            scope,
            backends,
            waiters: args
                .waiters
                .clone()
                .unwrap_or_else(|| if full { vec![2, 8, 32] } else { vec![8] }),
            concurrency,
            duration: args.duration,
            renewal_locks: args
                .renewal_locks
                .unwrap_or(if full { 100_000 } else { 10_000 }),
            renewal_duration: args.renewal_duration.unwrap_or(if full {
                Duration::from_secs(30)
            } else {
                Duration::from_secs(5)
            }),
            wave_locks: args.wave_locks.unwrap_or(if full { 1000 } else { 0 }),
            lock_all_sizes: vec![2, 8],
            etcd_bare_ceilings: full,
            etcd_put_ceiling: full || args.fsync,
            side_clusters: full,
            zookeeper_concurrency,
            contended_all: full,
            postgres_lock_rows: full,
            fenced_locks: if full {
                &["etcd", "redis", "zookeeper"]
            } else {
                &["etcd"]
            },
            mariadb_locks: if full { &["etcd", "redis"] } else { &["etcd"] },
            renewal_backends: if full {
                &["etcd", "redis", "zookeeper", "redlock"]
            } else {
                &["etcd"]
            },
            local_etcd: args.endpoints.etcd.is_none(),
            local_zookeeper: args.endpoints.zookeeper.is_none(),
            cluster: args.cluster,
        }
    }

    /// Whether `name` is benched.
    pub fn wants(&self, name: &str) -> bool {
        self.backends.iter().any(|b| b == name)
    }

    /// Whether the mutual-TLS etcd and the 3-member etcd run (a local single etcd only).
    fn etcd_side(&self) -> bool {
        self.side_clusters && self.local_etcd && self.wants("etcd")
    }

    fn etcd_three(&self) -> bool {
        self.etcd_side() && !self.cluster
    }

    fn zookeeper_three(&self) -> bool {
        self.side_clusters && self.local_zookeeper && self.wants("zookeeper")
    }

    /// Whether the run needs `backend`'s server and lock: benched, or (etcd and Redis)
    /// the lock of a fenced-write row of this run.
    pub fn needs(&self, backend: &str) -> bool {
        let locks_a_store =
            |store: &str, locks: &[&str]| self.wants(store) && locks.contains(&backend);
        self.wants(backend)
            || (matches!(backend, "etcd" | "redis")
                && (locks_a_store("postgres", self.fenced_locks)
                    || locks_a_store("mariadb", self.mariadb_locks)))
    }

    /// What the run will do, counted (`go_peer`: Go's concurrency.Mutex is there).
    pub fn steps(&self, go_peer: bool) -> Steps {
        let mut s = Steps::default();
        let go = u64::from(go_peer && self.wants("etcd"));
        let above_one = |list: &[usize]| count(list.iter().filter(|c| **c > 1));
        let c = count(&self.concurrency);
        let w = count(&self.waiters);
        if self.wants("etcd") {
            // etcd's Lock RPC, the lock, Go's Mutex; put and three bare cycles in full.
            s.cells += c
                * (2 + if self.etcd_bare_ceilings {
                    4
                } else {
                    u64::from(self.etcd_put_ceiling)
                });
            s.go_cells += c * go;
            // One name: the lock and Go's Mutex.
            s.cells += w;
            s.go_cells += w * go;
            if self.etcd_side() {
                // The TLS rows at every concurrency, a connect each way.
                s.cells += c + 2;
            }
            if self.etcd_three() {
                // The Lock RPC and the lock at every concurrency above 1, Go's Mutex
                // there too, and handoffs.
                s.cells += 2 * above_one(&self.concurrency) + w;
                s.go_cells += above_one(&self.concurrency) * go;
            }
            if self.wave_locks > 0 {
                s.cells += 1;
            }
            // Several locks together: lock_all and one by one, for each size.
            s.cells += 2 * count(&self.lock_all_sizes);
        }
        if self.wants("redis") {
            // The bare cycle and the lock.
            s.cells += 2 * c;
        }
        if self.wants("redlock") {
            s.cells += c;
        }
        if self.wants("postgres") && self.postgres_lock_rows {
            s.cells += c;
        }
        if self.wants("zookeeper") {
            s.cells += count(&self.zookeeper_concurrency);
            s.kazoo_cells += u64::from(self.zookeeper_concurrency.contains(&1));
            if self.zookeeper_three() {
                s.cells += above_one(&self.concurrency);
            }
        }
        if self.contended_all {
            for backend in ["redis", "redlock", "zookeeper"] {
                if self.wants(backend) {
                    s.cells += w;
                }
            }
            if self.wants("postgres") && self.postgres_lock_rows {
                s.cells += w;
            }
            if self.zookeeper_three() {
                s.cells += w;
            }
        }
        for (store, locks) in [
            ("postgres", self.fenced_locks),
            ("mariadb", self.mariadb_locks),
        ] {
            if self.wants(store) {
                // A plain and a fenced write per lock.
                s.cells += 2 * count(locks.iter().filter(|l| self.needs(l)));
            }
        }
        if self.renewal_locks > 0 {
            s.renewals = count(self.renewal_backends.iter().filter(|b| self.wants(b)));
        }
        s
    }

    /// The servers this run starts (local) or uses (given), for the header and the
    /// estimate.
    pub fn servers(&self) -> Vec<Server> {
        let mut servers = Vec::new();
        if self.needs("etcd") {
            servers.push(Server::Etcd {
                members: if self.cluster { 3 } else { 1 },
            });
            if self.etcd_side() {
                servers.push(Server::EtcdTls);
            }
            if self.etcd_three() {
                servers.push(Server::Etcd { members: 3 });
            }
        }
        if self.needs("redis") {
            servers.push(Server::Redis);
        }
        if self.wants("redlock") {
            servers.push(Server::RedlockMasters);
        }
        if self.wants("zookeeper") {
            servers.push(Server::ZooKeeper { members: 1 });
            if self.zookeeper_three() {
                servers.push(Server::ZooKeeper { members: 3 });
            }
        }
        if self.wants("postgres") {
            servers.push(Server::Postgres);
        }
        if self.wants("mariadb") {
            servers.push(Server::MariaDb);
        }
        servers
    }

    /// How long the run will take: every cell's duration and what it costs around it,
    /// the renewal rows, the servers' start and the Go peer's build (`go_build`: none
    /// when the peer is not there). Constants from runs on a 2-core machine; a loaded
    /// machine takes longer.
    pub fn estimate(&self, go_peer: bool, go_build: Duration) -> Duration {
        let s = self.steps(go_peer);
        let cell = self.duration.as_secs_f64();
        let mut seconds = 0.0;
        // A cell: its duration, the compaction before it, the workers' start.
        seconds += to_f64(s.cells + s.kazoo_cells) * (cell + CELL_OVERHEAD_S);
        // A Go cell starts a process whose first cycle is untimed; kazoo starts a Python.
        seconds += to_f64(s.go_cells) * (cell + CELL_OVERHEAD_S + GO_CELL_OVERHEAD_S);
        seconds += to_f64(s.kazoo_cells) * KAZOO_OVERHEAD_S;
        if self.renewal_locks > 0 {
            for backend in self.renewal_backends.iter().filter(|b| self.wants(b)) {
                let per_lock = match *backend {
                    "etcd" => ETCD_HELD_LOCK_S,
                    "zookeeper" => ZOOKEEPER_HELD_LOCK_S,
                    "redlock" => REDLOCK_HELD_LOCK_S,
                    _ => REDIS_HELD_LOCK_S,
                };
                seconds += self.renewal_duration.as_secs_f64()
                    + to_f64(count_usize(self.renewal_locks)) * per_lock;
            }
        }
        seconds += self.servers().iter().map(Server::start_s).sum::<f64>();
        if go_peer && self.wants("etcd") {
            seconds += go_build.as_secs_f64();
        }
        Duration::from_secs_f64(seconds)
    }

    /// What the run compares, a line each, for the first lines of the output.
    pub fn compared(&self, go_peer: bool) -> Vec<String> {
        let tasks = tasks(&self.concurrency);
        let mut lines = Vec::new();
        if self.wants("etcd") {
            let mut peers = Vec::new();
            if go_peer {
                peers.push("Go's concurrency.Mutex");
            }
            peers.push("etcd's Lock RPC");
            if self.etcd_bare_ceilings {
                peers.push("the bare acquire txn + delete (3 kinds)");
            }
            if self.etcd_put_ceiling {
                peers.push("a raw put");
            }
            lines.push(format!(
                "etcd lock vs {}, distinct names, {tasks}",
                and_list(&peers)
            ));
            if self.etcd_side() {
                let three = if self.etcd_three() {
                    " and on a 3-member cluster (beside its Lock RPC and Go's Mutex)"
                } else {
                    ""
                };
                lines.push(format!(
                    "  the same over mutual TLS{three}; connecting, plaintext vs TLS"
                ));
            }
            let go = if go_peer {
                " vs Go's concurrency.Mutex"
            } else {
                ""
            };
            lines.push(format!(
                "one name, {}: etcd lock{go} (cycles/s, handoff latency)",
                waiters(&self.waiters)
            ));
            if self.wave_locks > 0 {
                lines.push(format!(
                    "etcd: waves of {} locks taken and released together (write requests per cycle)",
                    self.wave_locks
                ));
            }
        }
        if self.wants("redis") {
            lines.push(format!(
                "Redis lock vs a bare SET NX PX + compare-and-delete cycle, {tasks}"
            ));
        }
        if self.wants("redlock") {
            lines.push(format!("Redlock on 3 masters, {tasks}"));
        }
        if self.wants("postgres") && self.postgres_lock_rows {
            lines.push(format!("PostgreSQL advisory lock, {tasks}"));
        }
        if self.wants("zookeeper") {
            lines.push(format!(
                "ZooKeeper lock vs Python kazoo's Lock (at 1 task, where python3-kazoo is \
                 installed), {}{}",
                tasks_of(&self.zookeeper_concurrency),
                if self.zookeeper_three() {
                    "; also on a 3-member ensemble"
                } else {
                    ""
                }
            ));
        }
        if self.contended_all {
            let others: Vec<&str> = ["redis", "redlock", "postgres", "zookeeper"]
                .into_iter()
                .filter(|b| self.wants(b) && (*b != "postgres" || self.postgres_lock_rows))
                .collect();
            if !others.is_empty() {
                lines.push(format!(
                    "one name, {}: {}",
                    waiters(&self.waiters),
                    others.join(", ")
                ));
            }
        }
        for (backend, store, locks) in [
            ("postgres", "PostgreSQL", self.fenced_locks),
            ("mariadb", "MariaDB", self.mariadb_locks),
        ] {
            let locks: Vec<&str> = locks.iter().copied().filter(|l| self.needs(l)).collect();
            if self.wants(backend) && !locks.is_empty() {
                lines.push(format!(
                    "lock + fenced {store} write + release vs the plain write, {} lock",
                    locks.join(", ")
                ));
            }
        }
        if self.renewal_locks > 0 {
            let held: Vec<&str> = self
                .renewal_backends
                .iter()
                .copied()
                .filter(|b| self.wants(b))
                .collect();
            if !held.is_empty() {
                lines.push(format!(
                    "renewal: {} locks held {} s by one client, {} (requests to keep them, memory per lock)",
                    thousands(self.renewal_locks),
                    self.renewal_duration.as_secs_f64(),
                    held.join(", ")
                ));
            }
        }
        lines
    }
}

// The constants below come from runs of 2026-12-03 on a 2-core machine shared with
// builds (load average 3-7): the default run took 95-109 s where they estimate 103 s, the
// full one 9 min 30 s where they estimate 9 min 35 s.

/// Seconds a cell costs beyond its duration (compaction, the workers' start, a contended
/// cell's last waiter).
const CELL_OVERHEAD_S: f64 = 0.1;
/// More for a Go cell: the process, its connection, its untimed first cycles.
const GO_CELL_OVERHEAD_S: f64 = 0.2;
/// The kazoo cell's Python start and connection.
const KAZOO_OVERHEAD_S: f64 = 1.0;
/// Taking and releasing one held lock in the renewal rows, one client (the release is one
/// lock after another): at 100,000 locks etcd took 18 s + 54 s, ZooKeeper 28 s + 30 s,
/// Redlock 3 s + 14 s, Redis 2 s + 4 s.
const ETCD_HELD_LOCK_S: f64 = 0.000_7;
const ZOOKEEPER_HELD_LOCK_S: f64 = 0.000_6;
const REDLOCK_HELD_LOCK_S: f64 = 0.000_17;
const REDIS_HELD_LOCK_S: f64 = 0.000_1;

/// The Go peer's build when its cache is cold (17-25 s measured), and warm
/// (`FENCELOCK_GO_CACHE`).
pub const GO_BUILD_COLD: Duration = Duration::from_secs(20);
pub const GO_BUILD_WARM: Duration = Duration::from_secs(5);

/// A server the run starts or uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Etcd { members: usize },
    EtcdTls,
    Redis,
    RedlockMasters,
    ZooKeeper { members: usize },
    Postgres,
    MariaDb,
}

impl Server {
    /// Seconds a local one takes to start (a given one: about as long to connect to,
    /// which is little; counted alike, an estimate).
    fn start_s(&self) -> f64 {
        match self {
            // Measured 0.2-2.6 s each; PostgreSQL's and MariaDB's first start on a machine
            // initialises a data dir the next ones copy.
            Self::Etcd { members } | Self::ZooKeeper { members } if *members > 1 => 2.5,
            Self::Etcd { .. } | Self::EtcdTls => 0.5,
            Self::Redis => 0.2,
            Self::RedlockMasters => 0.3,
            Self::ZooKeeper { .. } => 1.5,
            Self::Postgres | Self::MariaDb => 2.0,
        }
    }

    /// Its name in the header.
    pub fn describe(&self, fsync: bool) -> String {
        let fsync = if fsync { "fsync on" } else { "fsync off" };
        match self {
            Self::Etcd { members: 1 } => format!("etcd ({fsync})"),
            Self::Etcd { members } => format!("etcd {members} members ({fsync})"),
            Self::EtcdTls => "etcd over mutual TLS".into(),
            Self::Redis => "redis-server".into(),
            Self::RedlockMasters => "3 redis-server masters (Redlock)".into(),
            Self::ZooKeeper { members: 1 } => "ZooKeeper".into(),
            Self::ZooKeeper { members } => format!("ZooKeeper {members} members"),
            Self::Postgres => "PostgreSQL".into(),
            Self::MariaDb => "MariaDB".into(),
        }
    }
}

/// What a plan comes to, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Cells of `--duration` measured in this process (one progress step each; a
    /// contended cell's handoff row comes with it).
    pub cells: u64,
    /// Cells run by the Go peer (a progress step each).
    pub go_cells: u64,
    /// kazoo's cell (no progress step of its own).
    pub kazoo_cells: u64,
    /// Renewal rows (a progress step each).
    pub renewals: u64,
}

impl Steps {
    /// The progress bar's length.
    pub fn progress(&self) -> u64 {
        self.cells + self.go_cells + self.renewals
    }

    /// Cells of `--duration`, every kind.
    pub fn timed_cells(&self) -> u64 {
        self.cells + self.go_cells + self.kazoo_cells
    }
}

fn count<I: IntoIterator>(items: I) -> u64 {
    count_usize(items.into_iter().count())
}

fn count_usize(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn to_f64(n: u64) -> f64 {
    n as f64
}

/// `1, 8, 64 tasks`, `1 task`.
fn tasks(list: &[usize]) -> String {
    tasks_of(list)
}

fn tasks_of(list: &[usize]) -> String {
    let unit = if list == [1] { "task" } else { "tasks" };
    format!("{} {unit}", join(list))
}

/// `8 waiters`, `2, 8, 32 waiters`.
fn waiters(list: &[usize]) -> String {
    format!("{} waiters", join(list))
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

fn join(list: &[usize]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `10,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `2 min 5 s`, `45 s`.
pub fn minutes(duration: Duration) -> String {
    let total = duration.as_secs_f64().round();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let total = total as u64;
    match (total / 60, total % 60) {
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::{Plan, Scope, Server, minutes, thousands};
    use crate::bench::BenchArgs;
    use clap::Parser;
    use std::time::Duration;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn plan(flags: &[&str]) -> Plan {
        let args = Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
            .expect("flags parse")
            .bench;
        Plan::new(&args)
    }

    #[test]
    fn the_full_run_keeps_every_cell_of_before() {
        // 88 progress steps: the count of the run before the quick default existed; and
        // the four rows of several locks together.
        let full = plan(&["--full"]);
        assert_eq!(full.scope, Scope::Full);
        assert_eq!(full.steps(true).progress(), 88 + 4);
        assert_eq!(full.waiters, [2, 8, 32]);
        assert_eq!((full.renewal_locks, full.wave_locks), (100_000, 1000));
        assert_eq!(full.backends.len(), 6);
        assert!(full.servers().contains(&Server::EtcdTls));
        assert!(full.servers().contains(&Server::ZooKeeper { members: 3 }));
    }

    #[test]
    fn the_quick_run_is_the_headline_rows() {
        let quick = plan(&[]);
        assert_eq!(quick.scope, Scope::Quick);
        let steps = quick.steps(true);
        // etcd: Lock RPC, lock, Go's Mutex at 1, 8, 64; Redis: bare, lock at 1, 8, 64;
        // ZooKeeper at 1 (and kazoo); one name, 8 waiters, lock and Go; the fenced write
        // and its plain twin; one renewal row; etcd's lock_all of 2 and 8 names and the
        // same names one by one.
        assert_eq!(steps.cells, 6 + 1 + 6 + 1 + 2 + 4);
        assert_eq!(steps.go_cells, 3 + 1);
        assert_eq!(steps.kazoo_cells, 1);
        assert_eq!(steps.renewals, 1);
        assert_eq!(steps.timed_cells(), 25);
        assert_eq!(quick.zookeeper_concurrency, [1]);
        assert_eq!(
            quick.servers(),
            [
                Server::Etcd { members: 1 },
                Server::Redis,
                Server::ZooKeeper { members: 1 },
                Server::Postgres
            ]
        );
    }

    #[test]
    fn a_quick_run_with_fsync_adds_the_raw_put_at_each_concurrency() {
        let quick = plan(&[]);
        let fsync = plan(&["--fsync"]);
        assert!(!quick.etcd_put_ceiling && fsync.etcd_put_ceiling);
        assert_eq!(fsync.steps(true).cells, quick.steps(true).cells + 3);
        assert!(fsync.compared(true)[0].contains("a raw put"));
        assert!(!quick.compared(true)[0].contains("a raw put"));
    }

    #[test]
    fn flags_given_override_either_scope() {
        let quick = plan(&[
            "--backends",
            "etcd",
            "--waiters",
            "2,32",
            "--renewal-locks",
            "0",
            "--wave-locks",
            "100",
            "--concurrency",
            "8",
        ]);
        assert_eq!(quick.waiters, [2, 32]);
        let steps = quick.steps(false);
        // Lock RPC and lock at 8, two waiter counts, one wave, the four lock_all rows,
        // no renewal.
        assert_eq!(
            (steps.cells, steps.go_cells, steps.renewals),
            (2 + 2 + 1 + 4, 0, 0)
        );
        let full = plan(&["--full", "--renewal-duration", "2s", "--backends", "redis"]);
        assert_eq!(full.renewal_duration, Duration::from_secs(2));
        // Bare and lock at 3 concurrencies, contended at 3 waiter counts, a renewal.
        assert_eq!(full.steps(true).progress(), 6 + 3 + 1);
        // The quick fenced write is locked by etcd: no Redis for it.
        let fenced = plan(&["--backends", "etcd,postgres"]);
        assert_eq!(
            fenced.servers(),
            [Server::Etcd { members: 1 }, Server::Postgres]
        );
        // Given endpoints start no side clusters.
        let given = plan(&["--full", "--backends", "etcd", "--etcd", "http://h:2379"]);
        assert_eq!(given.servers(), [Server::Etcd { members: 1 }]);
    }

    #[test]
    fn the_quick_estimate_fits_three_minutes_and_the_full_one_is_minutes_more() {
        let cold = super::GO_BUILD_COLD;
        let quick = plan(&[]).estimate(true, cold);
        assert!(quick <= Duration::from_secs(150), "{quick:?}");
        assert!(quick >= Duration::from_secs(63), "{quick:?}");
        let full = plan(&["--full"]).estimate(true, cold);
        assert!(full >= Duration::from_secs(7 * 60), "{full:?}");
        assert!(full <= Duration::from_secs(11 * 60), "{full:?}");
        // Shorter cells, shorter estimate; no Go peer, no build.
        let short = plan(&["--duration", "1s"]).estimate(true, cold);
        assert!(short + Duration::from_secs(21 * 2) <= quick + Duration::from_secs(1));
        assert!(plan(&[]).estimate(false, cold) + cold < quick);
    }

    #[test]
    fn the_header_names_the_peers() {
        let quick = plan(&[]).compared(true);
        assert!(quick[0].contains("Go's concurrency.Mutex and etcd's Lock RPC"));
        assert!(quick[0].ends_with("1, 8, 64 tasks"), "{quick:?}");
        assert!(
            quick
                .iter()
                .any(|l| l.contains("kazoo") && l.ends_with("1 task"))
        );
        assert!(quick.iter().any(|l| l.contains("fenced PostgreSQL write")));
        assert!(
            quick
                .iter()
                .any(|l| l.starts_with("renewal: 10,000 locks held 5 s"))
        );
        let without_go = plan(&[]).compared(false);
        assert!(!without_go[0].contains("Go"));
        let full = plan(&["--full"]).compared(true);
        assert!(full.iter().any(|l| l.contains("mutual TLS")));
        assert!(
            full.iter()
                .any(|l| l.contains("MariaDB write") && l.contains("etcd, redis"))
        );
    }

    #[test]
    fn durations_and_counts_read_plainly() {
        assert_eq!(minutes(Duration::from_secs(125)), "2 min 5 s");
        assert_eq!(minutes(Duration::from_secs(45)), "45 s");
        assert_eq!(minutes(Duration::from_secs(540)), "9 min");
        assert_eq!(thousands(10_000), "10,000");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(999), "999");
    }
}
