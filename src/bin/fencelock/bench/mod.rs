//! `fencelock bench`: every backend through the same lock trait, beside the ceilings
//! measured in the same run, with ratios computed inside the run.

mod driver;
mod go_mutex;
mod kazoo;
mod mariadb;
mod report;
mod stats;
mod targets;
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use fencelock::etcd::EtcdLocker;
use fencelock::postgres::PgAdvisoryLocker;
use fencelock::redis::{RedisLocker, RedlockLocker};
use fencelock::zookeeper::ZooKeeperLocker;
use indicatif::{ProgressBar, ProgressStyle};

use targets::Targets;
use workloads::Runner;

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const BACKENDS: [&str; 5] = ["etcd", "redis", "redlock", "postgres", "zookeeper"];
/// Storage without a lock of its own: only the fenced-write rows (locked by etcd and Redis).
const STORES: [&str; 1] = ["mariadb"];

/// Options of `fencelock bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// How long each measured cell runs (e.g. 500ms, 3s, 1m30s: humantime's forms; a bare
    /// number is seconds).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Exit 1 if a performance bar is missed (for CI); by default the bars only inform.
    #[arg(long)]
    pub check: bool,
    /// Concurrencies of the distinct-key workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<usize>,
    /// Waiter counts of the one-key (contended) workload.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32")]
    pub waiters: Vec<usize>,
    /// Backends to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "etcd,redis,redlock,postgres,zookeeper,mariadb"
    )]
    pub backends: Vec<String>,
    /// Locks held by one client in the renewal workload (0 skips it); it also measures the
    /// resident memory each held lock costs.
    #[arg(long, default_value_t = 100_000)]
    pub renewal_locks: usize,
    /// Different locks one process takes at once, then releases, in the etcd waves
    /// workload (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub wave_locks: usize,
    /// How long the renewal workload holds them.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub renewal_duration: Duration,
    #[command(flatten)]
    pub endpoints: crate::endpoints::Endpoints,
    /// An existing MariaDB or MySQL instead of a local MariaDB, for the fenced-write rows
    /// (mysql://user:password@host:port/database; plaintext).
    #[arg(long, value_name = "URL")]
    pub mariadb: Option<String>,
    #[command(flatten)]
    pub metrics: crate::metrics_listen::MetricsListen,
    /// Start a local 3-member etcd cluster instead of a single node.
    #[arg(long)]
    pub cluster: bool,
    /// Let the local etcd fsync its WAL (off by default, like the other local servers).
    #[arg(long)]
    pub fsync: bool,
    /// The `etcd` binary the local etcd servers run (default: `etcd` on `PATH`), e.g.
    /// `--etcd-bin "$(.ci/fetch-etcd-3.5)"` to measure etcd 3.5. The report's header names
    /// the version every server reports of itself.
    #[arg(long, env = "FENCELOCK_ETCD_BIN", value_name = "PATH")]
    pub etcd_bin: Option<PathBuf>,
    /// Write every figure and the environment as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a Markdown report with SVG charts into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Parses the CLI's durations with `humantime`: `250ms`, `3s`, `1m30s`, `1.5m`, `2h`,
/// `1h 15min`. A bare number is seconds (`10`, `1.5`), as it was before humantime. A
/// negative or zero duration is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("a duration cannot be negative: {text:?}"));
    }
    let bare_seconds = !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '.');
    let parsed = if bare_seconds {
        humantime::parse_duration(&format!("{text}s"))
    } else {
        humantime::parse_duration(text)
    };
    let duration = parsed.map_err(|err| {
        format!("not a duration: {text:?} ({err}); use e.g. 250ms, 10s, 1m30s, 2h")
    })?;
    if duration.is_zero() {
        return Err(format!("duration must be above zero: {text:?}"));
    }
    Ok(duration)
}

/// Runs the benchmark and writes its outputs; `Ok(false)` when `--check` is on and a
/// performance bar was missed.
pub async fn run(args: BenchArgs) -> BoxResult<bool> {
    for backend in &args.backends {
        if !BACKENDS.contains(&backend.as_str()) && !STORES.contains(&backend.as_str()) {
            let known = [BACKENDS.as_slice(), STORES.as_slice()].concat().join(",");
            return Err(format!("unknown backend {backend:?}: use {known}").into());
        }
    }
    if args
        .concurrency
        .iter()
        .chain(&args.waiters)
        .any(|&c| c == 0)
    {
        return Err("concurrency and waiter counts must be at least 1".into());
    }
    args.metrics.start()?;
    let wants = |name: &str| args.backends.iter().any(|b| b == name);
    // The peer of the etcd rows, built before any server starts: its build is in no cell.
    let go_peer = match &args.endpoints.etcd {
        _ if !wants("etcd") => None,
        Some(given) if !go_mutex::reachable(given, &args.endpoints.tls) => {
            eprintln!(
                "skipping the Go concurrency.Mutex peer: it runs only against plaintext etcd \
                 endpoints without credentials"
            );
            None
        }
        _ => go_mutex::GoMutex::build().await,
    };
    let targets = Targets::prepare(&args).await?;

    let cells = planned_cells(&args, go_peer.is_some());
    let progress = ProgressBar::new(cells);
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let run = format!("{:x}", std::process::id());
    let mut runner = Runner {
        args: &args,
        progress,
        cells: Vec::new(),
        renewals: Vec::new(),
        run,
        etcd_clusters: Vec::new(),
    };

    let etcd = match targets.etcd_config("bench")? {
        Some(config) if wants("etcd") || wants("postgres") || wants("mariadb") => {
            Some(EtcdLocker::connect(config).await?)
        }
        _ => None,
    };
    let etcd_tls = match &targets.etcd_tls {
        Some(config) if wants("etcd") => Some(EtcdLocker::connect(config.clone()).await?),
        _ => None,
    };
    let etcd_three = match &targets.etcd_three {
        Some(config) if wants("etcd") => Some(EtcdLocker::connect(config.clone()).await?),
        _ => None,
    };
    runner.etcd_clusters = [&etcd, &etcd_tls, &etcd_three]
        .into_iter()
        .flatten()
        .map(|locks| locks.client().clone())
        .collect();
    let redis = match targets.redis_config("bench") {
        Some(config) if wants("redis") || wants("postgres") || wants("mariadb") => {
            Some(RedisLocker::connect(config).await?)
        }
        _ => None,
    };
    let redlock = match targets.redlock_config("bench") {
        Some(config) if wants("redlock") => Some(RedlockLocker::connect(config).await?),
        _ => None,
    };
    let postgres_tls = args.endpoints.tls.postgres();
    let postgres = match &targets.postgres {
        Some(conn) if wants("postgres") => {
            let locks = match &postgres_tls {
                Some(tls) => PgAdvisoryLocker::connect_with_tls(conn, tls).await?,
                None => PgAdvisoryLocker::connect(conn).await?,
            };
            locks.ensure_schema().await?;
            Some(locks)
        }
        _ => None,
    };
    let zookeeper = match targets.zookeeper_config() {
        Some(config) if wants("zookeeper") => Some(ZooKeeperLocker::connect(config).await?),
        _ => None,
    };
    let zookeeper_three = match &targets.zookeeper_three {
        Some(config) if wants("zookeeper") => Some(ZooKeeperLocker::connect(config.clone()).await?),
        _ => None,
    };
    // The versions the servers report of themselves, not those of binaries on PATH.
    let mut versions = report::ServerVersions::ask(
        etcd.as_ref().map(|locks| locks.client().clone()),
        redis.as_ref().map(RedisLocker::connection),
        targets
            .postgres
            .as_deref()
            .filter(|_| wants("postgres"))
            .map(|conn| (conn, postgres_tls.as_ref())),
        targets.mariadb.as_deref().filter(|_| wants("mariadb")),
    )
    .await;
    if let Some(hosts) = targets.zookeeper.as_deref().filter(|_| wants("zookeeper")) {
        versions.zookeeper = workloads::zookeeper_version(hosts).await;
    }
    runner.progress.suspend(|| eprintln!("{}", versions.line()));
    let mut environment = report::environment(&args, &targets, versions);
    if let Some(peer) = &go_peer {
        environment.go_peer.clone_from(&peer.version);
    }

    // Each concurrency level runs every subject back to back, ceiling first, so that a
    // ratio compares cells measured minutes apart at most, on the same server state.
    for &c in &args.concurrency {
        let c = [c];
        if let (true, Some(locks)) = (wants("etcd"), &etcd) {
            runner.etcd_ceilings(locks.client().clone(), &c).await?;
            runner.distinct("etcd", locks.clone(), &c).await?;
            if let (Some(peer), Some(endpoints)) = (&go_peer, &targets.etcd) {
                // The peer: Go's concurrency.Mutex, against the same etcd.
                runner
                    .go_distinct(peer, go_mutex::SUBJECT, endpoints, c[0])
                    .await?;
            }
        }
        if let Some(locks) = &etcd_tls {
            runner.distinct("etcd TLS", locks.clone(), &c).await?;
        }
        if let (Some(locks), true) = (&etcd_three, c[0] > 1) {
            // etcd's Lock RPC on the same cluster first: the bar for group commit
            // holds on 3 members too, and replication changes both sides.
            runner
                .lock_rpc_on("etcd 3 members Lock RPC", locks.client().clone(), c[0])
                .await?;
            runner.distinct("etcd 3 members", locks.clone(), &c).await?;
            if let (Some(peer), Some(endpoints)) = (&go_peer, &targets.etcd_three_endpoints) {
                // The peer on the same cluster: the bar at 64 tasks holds on 3 members too.
                runner
                    .go_distinct(peer, go_mutex::SUBJECT_THREE, endpoints, c[0])
                    .await?;
            }
        }
        if let (true, Some(locks)) = (wants("redis"), &redis) {
            runner.redis_ceiling(locks.connection(), &c).await?;
            runner.distinct("redis", locks.clone(), &c).await?;
        }
        if let Some(locks) = &redlock {
            runner.distinct("redlock", locks.clone(), &c).await?;
        }
        if let Some(locks) = &postgres {
            runner.distinct("postgres", locks.clone(), &c).await?;
        }
        if let Some(locks) = &zookeeper {
            runner.distinct("zookeeper", locks.clone(), &c).await?;
            if let (1, Some(hosts)) = (c[0], &targets.zookeeper) {
                // The peer: Python's kazoo lock, one cycle after another.
                let path = format!("/bench-kazoo/{}", runner.run);
                if let Some(cell) = kazoo::cycles(hosts, &path, args.duration).await? {
                    runner.cells.push(cell);
                }
            }
        }
        if let (Some(locks), true) = (&zookeeper_three, c[0] > 1) {
            runner
                .distinct("zookeeper 3 members", locks.clone(), &c)
                .await?;
        }
    }
    if let (true, Some(locks)) = (wants("etcd"), &etcd) {
        // Each waiter count: the etcd lock, then Go's concurrency.Mutex.
        for &w in &args.waiters {
            runner.contended("etcd", locks.clone(), &[w]).await?;
            if let (Some(peer), Some(endpoints)) = (&go_peer, &targets.etcd) {
                runner.go_contended(peer, endpoints, w).await?;
            }
        }
    }
    if let Some(locks) = &etcd_three {
        runner
            .contended("etcd 3 members", locks.clone(), &args.waiters)
            .await?;
    }
    let readable = targets
        .etcd_metrics
        .iter()
        .all(|e| e.starts_with("http://"));
    if let (true, true, true, Some(locks)) = (wants("etcd"), readable, args.wave_locks > 0, &etcd) {
        let endpoints = targets.etcd_metrics.clone();
        let count = move || workloads::etcd_writes(endpoints.clone());
        runner
            .waves("etcd", locks.clone(), args.wave_locks, count)
            .await?;
    }
    if let (Some(plain), Some(tls)) = (targets.etcd_config("bench")?, &targets.etcd_tls) {
        if wants("etcd") {
            runner.connects("etcd", plain).await?;
            runner.connects("etcd TLS", tls.clone()).await?;
        }
    }
    if let (true, Some(locks)) = (wants("redis"), &redis) {
        runner
            .contended("redis", locks.clone(), &args.waiters)
            .await?;
    }
    if let Some(locks) = &redlock {
        runner
            .contended("redlock", locks.clone(), &args.waiters)
            .await?;
    }
    if let Some(locks) = &postgres {
        runner
            .contended("postgres", locks.clone(), &args.waiters)
            .await?;
    }
    if let Some(locks) = &zookeeper {
        runner
            .contended("zookeeper", locks.clone(), &args.waiters)
            .await?;
    }
    if let Some(locks) = &zookeeper_three {
        runner
            .contended("zookeeper 3 members", locks.clone(), &args.waiters)
            .await?;
    }
    if let Some(conn) = targets.postgres.as_deref().filter(|_| wants("postgres")) {
        let tls = postgres_tls.as_ref();
        if let Some(locks) = &etcd {
            runner
                .fenced_write("etcd", locks.clone(), conn, tls)
                .await?;
        }
        if let Some(locks) = &redis {
            runner
                .fenced_write("redis", locks.clone(), conn, tls)
                .await?;
        }
        if let Some(locks) = &zookeeper {
            runner
                .fenced_write("zookeeper", locks.clone(), conn, tls)
                .await?;
        }
    }
    if let Some(url) = targets.mariadb.as_deref().filter(|_| wants("mariadb")) {
        if let Some(locks) = &etcd {
            runner
                .fenced_write_mariadb("etcd", locks.clone(), url)
                .await?;
        }
        if let Some(locks) = &redis {
            runner
                .fenced_write_mariadb("redis", locks.clone(), url)
                .await?;
        }
    }
    if args.renewal_locks > 0 {
        let readable = targets
            .etcd_metrics
            .iter()
            .all(|e| e.starts_with("http://"));
        if wants("etcd") && !readable {
            eprintln!(
                "skipping the etcd renewal workload: it counts keep-alives in etcd's metrics, \
                 which are not read over TLS"
            );
        }
        if let (true, true, Some(locks)) = (wants("etcd"), readable, &etcd) {
            let endpoints = targets.etcd_metrics.clone();
            let count = move || workloads::etcd_keepalives(endpoints.clone());
            runner
                .renewal(
                    "etcd",
                    locks.clone(),
                    count,
                    "keep-alive messages on the session's one stream",
                )
                .await?;
        }
        if let (true, Some(locks)) = (wants("redis"), &redis) {
            let connections = vec![locks.connection()];
            let count = move || workloads::redis_evalsha(connections.clone());
            runner
                .renewal(
                    "redis",
                    locks.clone(),
                    count,
                    "EVALSHA calls (one per 1,000 locks per tick)",
                )
                .await?;
        }
        if let (Some(locks), Some(hosts)) = (&zookeeper, targets.zookeeper.clone()) {
            let count = move || workloads::zookeeper_packets(hosts.clone());
            runner
                .renewal(
                    "zookeeper",
                    locks.clone(),
                    count,
                    "packets the server received (mntr): the session's pings and our heartbeats",
                )
                .await?;
        }
        if let Some(locks) = &redlock {
            let connections = locks.connections();
            let count = move || workloads::redis_evalsha(connections.clone());
            runner
                .renewal(
                    "redlock",
                    locks.clone(),
                    count,
                    "EVALSHA calls, summed over the masters",
                )
                .await?;
        }
    }
    runner.progress.finish_and_clear();

    let outcome = report::Outcome::new(environment, runner.cells, runner.renewals);
    print!("{}", outcome.table());
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&outcome)?)?;
        eprintln!("figures written to {}", path.display());
    }
    if let Some(dir) = &args.report {
        outcome.write_report(dir)?;
        eprintln!("report written to {}", dir.join("report.md").display());
    }
    if let Some(locks) = &etcd {
        locks.close().await?;
    }
    let missed = outcome.bars.iter().filter(|b| !b.holds).count();
    if args.check && missed > 0 {
        eprintln!("--check: {missed} performance bar(s) missed");
        return Ok(false);
    }
    Ok(true)
}

/// How many progress steps the run will take (`go_peer`: the Go concurrency.Mutex peer
/// was built, and runs beside the etcd lock at every concurrency and waiter count).
fn planned_cells(args: &BenchArgs, go_peer: bool) -> u64 {
    let wants = |name: &str| args.backends.iter().any(|b| b == name);
    let c = args.concurrency.len();
    let w = args.waiters.len();
    let mut cells = 0;
    if wants("etcd") {
        // Ceilings, and the TLS rows when etcd is local: a lock cycle per concurrency,
        // and a connect each way.
        cells += 5 * c;
        if args.endpoints.etcd.is_none() {
            cells += c + 2;
            if !args.cluster {
                // The 3-member rows: lock cycles and etcd's Lock RPC at every
                // concurrency above 1, handoffs.
                cells += 2 * args.concurrency.iter().filter(|c| **c > 1).count() + w;
            }
        }
    }
    if wants("etcd") && go_peer {
        cells += c + w;
        if args.endpoints.etcd.is_none() && !args.cluster {
            // The peer on the 3-member cluster too, at every concurrency above 1.
            cells += args.concurrency.iter().filter(|c| **c > 1).count();
        }
    }
    if wants("redis") {
        cells += c;
    }
    if wants("etcd") && args.wave_locks > 0 {
        cells += 1;
    }
    for backend in BACKENDS {
        if wants(backend) {
            cells += c + w;
        }
    }
    if wants("postgres") {
        cells += 4;
        if wants("zookeeper") {
            cells += 2;
        }
    }
    if wants("zookeeper") && args.endpoints.zookeeper.is_none() {
        // The 3-member rows: lock cycles at every concurrency above 1, handoffs.
        cells += args.concurrency.iter().filter(|c| **c > 1).count() + w;
    }
    if wants("mariadb") {
        cells += 4;
    }
    if args.renewal_locks > 0 {
        cells += ["etcd", "redis", "redlock", "zookeeper"]
            .iter()
            .filter(|b| wants(b))
            .count();
    }
    u64::try_from(cells).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn parses_humantime_forms_and_bare_seconds() {
        for (text, expected) in [
            ("250ms", Duration::from_millis(250)),
            ("1m30s", Duration::from_secs(90)),
            ("1h 15min", Duration::from_secs(4500)),
            ("1.5m", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("3s", Duration::from_secs(3)),
            (" 3s ", Duration::from_secs(3)),
            ("10", Duration::from_secs(10)),
            ("1.5", Duration::from_millis(1500)),
            ("500us", Duration::from_micros(500)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_positive_duration() {
        for (text, says) in [
            ("banana", "not a duration"),
            ("", "not a duration"),
            ("5x", "not a duration"),
            ("1.2.3", "not a duration"),
            ("99999999999999999999h", "not a duration"),
            ("0", "above zero"),
            ("0s", "above zero"),
            ("0.0", "above zero"),
            ("-5s", "cannot be negative"),
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
