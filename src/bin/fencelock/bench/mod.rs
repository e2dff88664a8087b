//! `fencelock bench`: every backend through the same lock trait, beside the ceilings
//! measured in the same run, with ratios computed inside the run. By default the headline
//! rows (about two minutes), `--full` every cell; a report with charts either way.

mod driver;
mod go_mutex;
mod header;
mod html;
mod kazoo;
mod mariadb;
mod plan;
mod ratio_chart;
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

use plan::Plan;
use targets::Targets;
use workloads::Runner;

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const BACKENDS: [&str; 5] = ["etcd", "redis", "redlock", "postgres", "zookeeper"];
/// Storage without a lock of its own: only the fenced-write rows (locked by etcd and Redis).
const STORES: [&str; 1] = ["mariadb"];

/// Options of `fencelock bench`. Flags without a value given take the scope's default
/// (quick or `--full`); a flag given is kept in either.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Run every cell and bar (every backend, the ceilings, TLS and 3-member clusters,
    /// every waiter count, 100,000 held locks: about 9.5 minutes on 2 cores) instead of
    /// the headline rows (about 2 minutes).
    #[arg(long)]
    pub full: bool,
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
    /// Waiter counts of the one-key (contended) workload [default: 8; --full: 2,8,32].
    #[arg(long, value_delimiter = ',')]
    pub waiters: Option<Vec<usize>>,
    /// Backends to run [default: etcd,redis,zookeeper,postgres (PostgreSQL as the fenced
    /// write's storage); --full: etcd,redis,redlock,postgres,zookeeper,mariadb].
    #[arg(long, value_delimiter = ',')]
    pub backends: Option<Vec<String>>,
    /// Locks held by one client in the renewal workload (0 skips it); it also measures the
    /// resident memory each held lock costs [default: 10000, etcd's; --full: 100000, each
    /// backend's].
    #[arg(long)]
    pub renewal_locks: Option<usize>,
    /// Different locks one process takes at once, then releases, in the etcd waves
    /// workload (0 skips it) [default: 0; --full: 1000].
    #[arg(long)]
    pub wave_locks: Option<usize>,
    /// How long the renewal workload holds them [default: 5s; --full: 30s].
    #[arg(long, value_parser = parse_duration)]
    pub renewal_duration: Option<Duration>,
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
    /// Write the report (report.html and report.md with SVG charts) into this directory
    /// [default: target/fencelock-bench, in the cargo target dir the binary runs from, else
    /// under the current directory].
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Write no report (the table, and `--json` if given, only).
    #[arg(long, conflicts_with = "report")]
    pub no_report: bool,
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
    let started = std::time::Instant::now();
    let plan = Plan::new(&args);
    for backend in &plan.backends {
        if !BACKENDS.contains(&backend.as_str()) && !STORES.contains(&backend.as_str()) {
            let known = [BACKENDS.as_slice(), STORES.as_slice()].concat().join(",");
            return Err(format!("unknown backend {backend:?}: use {known}").into());
        }
    }
    if plan
        .concurrency
        .iter()
        .chain(&plan.waiters)
        .any(|&c| c == 0)
    {
        return Err("concurrency and waiter counts must be at least 1".into());
    }
    let report_dir = match (&args.report, args.no_report) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.clone()),
        (None, false) => Some(header::default_report_dir()),
    };
    let wants = |name: &str| plan.wants(name);
    // What the run compares, where, and how long it will take: before anything starts.
    let go_expected = wants("etcd")
        && go_mutex::installed()
        && args
            .endpoints
            .etcd
            .as_ref()
            .is_none_or(|given| go_mutex::reachable(given, &args.endpoints.tls));
    print!(
        "{}",
        header::header(&args, &plan, go_expected, report_dir.as_deref())
    );
    args.metrics.start()?;
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
    let targets = Targets::prepare(&args, &plan).await?;

    let progress = ProgressBar::new(plan.steps(go_peer.is_some()).progress());
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let run = format!("{:x}", std::process::id());
    let mut runner = Runner {
        args: &args,
        plan: &plan,
        progress,
        cells: Vec::new(),
        renewals: Vec::new(),
        run,
        etcd_clusters: Vec::new(),
    };

    let etcd = match targets.etcd_config("bench")? {
        Some(config) if plan.needs("etcd") => Some(EtcdLocker::connect(config).await?),
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
        Some(config) if plan.needs("redis") => Some(RedisLocker::connect(config).await?),
        _ => None,
    };
    let redlock = match targets.redlock_config("bench") {
        Some(config) if wants("redlock") => Some(RedlockLocker::connect(config).await?),
        _ => None,
    };
    let postgres_tls = args.endpoints.tls.postgres();
    // The advisory lock's rows are the full run's: the quick one uses PostgreSQL as storage.
    let postgres = match &targets.postgres {
        Some(conn) if wants("postgres") && plan.postgres_lock_rows => {
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
    let mut environment = report::environment(&args, &plan, &targets, versions);
    if let Some(peer) = &go_peer {
        environment.go_peer.clone_from(&peer.version);
    }

    // Each concurrency level runs every subject back to back, ceiling first, so that a
    // ratio compares cells measured minutes apart at most, on the same server state.
    for &c in &plan.concurrency {
        let c = [c];
        if let (true, Some(locks)) = (wants("etcd"), &etcd) {
            if plan.etcd_bare_ceilings {
                runner.etcd_ceilings(locks.client().clone(), &c).await?;
            } else {
                // The quick run's ceiling: etcd's Lock RPC (and with --fsync the raw put,
                // the disk's limit).
                if plan.etcd_put_ceiling {
                    runner.etcd_put(locks.client().clone(), c[0]).await?;
                }
                runner
                    .lock_rpc_on("etcd Lock RPC", locks.client().clone(), c[0])
                    .await?;
            }
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
        if let (Some(locks), true) = (&zookeeper, plan.zookeeper_concurrency.contains(&c[0])) {
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
        for &w in &plan.waiters {
            runner.contended("etcd", locks.clone(), &[w]).await?;
            if let (Some(peer), Some(endpoints)) = (&go_peer, &targets.etcd) {
                runner.go_contended(peer, endpoints, w).await?;
            }
        }
    }
    if let Some(locks) = &etcd_three {
        runner
            .contended("etcd 3 members", locks.clone(), &plan.waiters)
            .await?;
    }
    if let (true, Some(locks)) = (wants("etcd"), &etcd) {
        runner
            .lock_all("etcd", locks.clone(), &plan.lock_all_sizes)
            .await?;
    }
    let readable = targets
        .etcd_metrics
        .iter()
        .all(|e| e.starts_with("http://"));
    if let (true, true, true, Some(locks)) = (wants("etcd"), readable, plan.wave_locks > 0, &etcd) {
        let endpoints = targets.etcd_metrics.clone();
        let count = move || workloads::etcd_writes(endpoints.clone());
        runner
            .waves("etcd", locks.clone(), plan.wave_locks, count)
            .await?;
    }
    if let (Some(plain), Some(tls)) = (targets.etcd_config("bench")?, &targets.etcd_tls) {
        if wants("etcd") {
            runner.connects("etcd", plain).await?;
            runner.connects("etcd TLS", tls.clone()).await?;
        }
    }
    // One name on the other backends: the full run's.
    let contended_all = plan.contended_all;
    if let (true, true, Some(locks)) = (contended_all, wants("redis"), &redis) {
        runner
            .contended("redis", locks.clone(), &plan.waiters)
            .await?;
    }
    if let (true, Some(locks)) = (contended_all, &redlock) {
        runner
            .contended("redlock", locks.clone(), &plan.waiters)
            .await?;
    }
    if let (true, Some(locks)) = (contended_all, &postgres) {
        runner
            .contended("postgres", locks.clone(), &plan.waiters)
            .await?;
    }
    if let (true, Some(locks)) = (contended_all, &zookeeper) {
        runner
            .contended("zookeeper", locks.clone(), &plan.waiters)
            .await?;
    }
    if let (true, Some(locks)) = (contended_all, &zookeeper_three) {
        runner
            .contended("zookeeper 3 members", locks.clone(), &plan.waiters)
            .await?;
    }
    if let Some(conn) = targets.postgres.as_deref().filter(|_| wants("postgres")) {
        let tls = postgres_tls.as_ref();
        let fenced = |lock: &str| plan.fenced_locks.contains(&lock);
        if let (true, Some(locks)) = (fenced("etcd"), &etcd) {
            runner
                .fenced_write("etcd", locks.clone(), conn, tls)
                .await?;
        }
        if let (true, Some(locks)) = (fenced("redis"), &redis) {
            runner
                .fenced_write("redis", locks.clone(), conn, tls)
                .await?;
        }
        if let (true, Some(locks)) = (fenced("zookeeper"), &zookeeper) {
            runner
                .fenced_write("zookeeper", locks.clone(), conn, tls)
                .await?;
        }
    }
    if let Some(url) = targets.mariadb.as_deref().filter(|_| wants("mariadb")) {
        let fenced = |lock: &str| plan.mariadb_locks.contains(&lock);
        if let (true, Some(locks)) = (fenced("etcd"), &etcd) {
            runner
                .fenced_write_mariadb("etcd", locks.clone(), url)
                .await?;
        }
        if let (true, Some(locks)) = (fenced("redis"), &redis) {
            runner
                .fenced_write_mariadb("redis", locks.clone(), url)
                .await?;
        }
    }
    let mut failed_rows: Vec<String> = Vec::new();
    if plan.renewal_locks > 0 {
        // The backends whose renewal rows this run has (the quick run: etcd's).
        // A row that fails (locks lost while held) is reported, and the run goes on: its
        // other figures are still worth having, and it ends with an error.
        let wants = |name: &str| wants(name) && plan.renewal_backends.contains(&name);
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
            let row = runner
                .renewal(
                    "etcd",
                    locks.clone(),
                    count,
                    "keep-alive messages on the session's one stream",
                )
                .await;
            failed_rows.extend(row.err().map(|err| err.to_string()));
        }
        if let (true, Some(locks)) = (wants("redis"), &redis) {
            let connections = vec![locks.connection()];
            let count = move || workloads::redis_evalsha(connections.clone());
            let row = runner
                .renewal(
                    "redis",
                    locks.clone(),
                    count,
                    "EVALSHA calls (one per 1,000 locks per tick)",
                )
                .await;
            failed_rows.extend(row.err().map(|err| err.to_string()));
        }
        if let (true, Some(locks), Some(hosts)) =
            (wants("zookeeper"), &zookeeper, targets.zookeeper.clone())
        {
            let count = move || workloads::zookeeper_packets(hosts.clone());
            let row = runner
                .renewal(
                    "zookeeper",
                    locks.clone(),
                    count,
                    "packets the server received (mntr): the session's pings and our heartbeats",
                )
                .await;
            failed_rows.extend(row.err().map(|err| err.to_string()));
        }
        if let (true, Some(locks)) = (wants("redlock"), &redlock) {
            let connections = locks.connections();
            let count = move || workloads::redis_evalsha(connections.clone());
            let row = runner
                .renewal(
                    "redlock",
                    locks.clone(),
                    count,
                    "EVALSHA calls, summed over the masters",
                )
                .await;
            failed_rows.extend(row.err().map(|err| err.to_string()));
        }
    }
    runner.progress.finish_and_clear();

    let outcome = report::Outcome::new(environment, runner.cells, runner.renewals);
    print!("{}", outcome.table());
    for failed in &failed_rows {
        println!("  FAILED renewal row: {failed}");
    }
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&outcome)?)?;
        eprintln!("figures written to {}", path.display());
    }
    if let Some(dir) = &report_dir {
        outcome.write_report(dir)?;
    }
    if let Some(locks) = &etcd {
        locks.close().await?;
    }
    let missed = outcome.bars.iter().filter(|b| !b.holds).count();
    println!(
        "\n{} run took {}",
        match plan.scope {
            plan::Scope::Quick => "the quick",
            plan::Scope::Full => "the full",
        },
        plan::minutes(started.elapsed())
    );
    if let Some(dir) = &report_dir {
        // Last, where a reader looks when the run ends.
        println!(
            "report: {} (charts: {}/*.svg; Markdown: report.md)",
            dir.join("report.html").display(),
            dir.display()
        );
    }
    if !failed_rows.is_empty() {
        return Err(format!("renewal row(s) failed: {}", failed_rows.join("; ")).into());
    }
    if args.check && missed > 0 {
        eprintln!("--check: {missed} performance bar(s) missed");
        return Ok(false);
    }
    Ok(true)
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
