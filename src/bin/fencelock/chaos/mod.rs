//! Fault-injection experiments on etcd, Redis, Redlock and ZooKeeper (scenarios S1-S8,
//! listed in the guide's `docs/chaos.md`): worker processes that take a
//! lock and update shared PostgreSQL rows with and without fencing, a runner that injects
//! the faults and collects what the workers report, and the checker that turns that record
//! into counts (also usable on its own as `fencelock check-log`).

pub mod checker;
mod events;
mod fleet;
mod monotonic;
mod naive;
mod report;
mod scenarios;
mod stage;
mod storage;
pub mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use fencelock::testkit::PostgresServer;

use crate::bench::{BoxResult, parse_duration};
use fleet::{Fleet, client_name};
use report::Row;
use scenarios::{Finding, LostUpdates, Scenario};
use stage::{Stage, proxied};
use storage::Store;
use worker::{ChaosBackend, WorkerArgs};

/// Options of `fencelock chaos`.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// Scenarios to run (S1..S8, comma-separated); all by default.
    #[arg(long, value_enum, value_delimiter = ',', ignore_case = true)]
    pub scenario: Vec<Scenario>,
    /// Backends to run (the naive baseline of S3 comes with redis).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "etcd,redis,redlock,zookeeper"
    )]
    pub backends: Vec<ChaosBackend>,
    /// Upper bound on one scenario run; a run still waiting then is reported as an error.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub run_timeout: Duration,
    /// Existing servers; with them, the scenarios that kill or skew servers (S4, S5, S7)
    /// are skipped.
    #[command(flatten)]
    pub endpoints: crate::endpoints::Endpoints,
    /// Write every row as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the table as Markdown.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Instead of the scenarios: the request-level fault soak of the etcd lock for this
    /// long (e.g. `2m`): clients on a 3-member cluster behind fault proxies, faults on a
    /// schedule drawn from `--seed`, every client's claims checked against etcd's history.
    /// Exits 1 on any violation, printing the seed and the history around it.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub soak: Option<Duration>,
    /// The soak's seed (default: drawn from the clock; printed either way).
    #[arg(long, requires = "soak")]
    pub seed: Option<u64>,
    /// The soak's clients, each with its own connection and proxies.
    #[arg(long, default_value_t = 4, requires = "soak")]
    pub soak_clients: usize,
    /// Tasks each soak client runs at once (on one session: requests of different names
    /// batch).
    #[arg(long, default_value_t = 6, requires = "soak")]
    pub soak_tasks: usize,
    /// Lock names the soak's tasks share.
    #[arg(long, default_value_t = 6, requires = "soak")]
    pub soak_names: usize,
    /// The etcd binary the soak's cluster runs (default: `etcd` on `PATH`).
    #[arg(long, env = "FENCELOCK_ETCD_BIN", value_name = "PATH")]
    pub etcd_bin: Option<PathBuf>,
}

/// The soak: runs it, prints its summary (and writes it as JSON with `--json`).
async fn soak(args: &ChaosArgs, duration: Duration) -> BoxResult<bool> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() ^ u64::from(d.subsec_nanos()))
    });
    eprintln!(
        "soak: seed {seed}, {duration:?} (again: fencelock chaos --soak {duration:?} --seed {seed})"
    );
    let mut config = fencelock::testkit::soak::SoakConfig::new(seed)
        .with_duration(duration)
        .with_clients(args.soak_clients)
        .with_tasks(args.soak_tasks)
        .with_names(args.soak_names);
    if let Some(binary) = &args.etcd_bin {
        config = config.with_etcd_binary(binary);
    }
    let report = fencelock::testkit::soak::soak(config).await?;
    print!("{}", report.summary());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(report.passed())
}

/// Runs the scenarios, prints the table; exits 1 if any run did not behave as the design
/// expects or failed.
pub async fn chaos(args: ChaosArgs) -> BoxResult<bool> {
    if let Some(duration) = args.soak {
        return soak(&args, duration).await;
    }
    let scenarios = if args.scenario.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenario.clone()
    };
    let runs: Vec<(Scenario, ChaosBackend)> = scenarios
        .iter()
        .flat_map(|s| s.backends(&args.backends).into_iter().map(move |b| (*s, b)))
        .collect();
    if runs.is_empty() {
        return Err("no scenario applies to the chosen backends".into());
    }
    let (_postgres, postgres_url) = match &args.endpoints.postgres {
        Some(url) => (None, url.clone()),
        None => {
            eprintln!("starting a local postgres");
            let server = PostgresServer::start().await?;
            let database = server.create_database().await?;
            let url = server.connection_string(&database);
            (Some(server), url)
        }
    };
    let logs = tempfile::Builder::new()
        .prefix("fencelock-chaos-")
        .tempdir()?;
    let bar = indicatif::ProgressBar::new(runs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    for (scenario, backend) in runs {
        bar.set_message(format!(
            "{scenario:?} {}: {}",
            backend.name(),
            scenario.title()
        ));
        let started = Instant::now();
        let mut row = match run_one(scenario, backend, &postgres_url, &args, logs.path()).await {
            Ok(row) => row,
            Err(err) => Row::not_run(scenario, backend, "error", err.to_string()),
        };
        row.seconds = started.elapsed().as_secs_f64();
        bar.inc(1);
        rows.push(row);
    }
    bar.finish_and_clear();
    print!("{}", report::terminal(&rows));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, report::markdown(&rows))?;
    }
    Ok(rows
        .iter()
        .all(|r| r.status == "skipped" || (r.status == "ran" && r.as_expected)))
}

/// One scenario for one backend: servers, workers, faults, verdict.
async fn run_one(
    scenario: Scenario,
    backend: ChaosBackend,
    postgres: &str,
    args: &ChaosArgs,
    logs: &std::path::Path,
) -> BoxResult<Row> {
    let plan = scenario.plan(backend);
    let mut stage = match Stage::build(backend, plan.topology, &args.endpoints).await? {
        Ok(stage) => stage,
        Err(reason) => return Ok(Row::not_run(scenario, backend, "skipped", reason)),
    };
    stage.tls = worker_tls(&args.endpoints, stage.given);
    let run = format!("{scenario:?}-{}-{:x}", backend.flag(), monotonic::now_ns()).to_lowercase();
    let postgres_tls = args
        .endpoints
        .postgres
        .as_ref()
        .and(args.endpoints.tls.postgres());
    let store = Store::connect(postgres, &run, postgres_tls.as_ref()).await?;
    store.prepare().await?;

    let mut proxies = Vec::new();
    let mut specs = Vec::new();
    for i in 0..plan.workers {
        let endpoints = if plan.proxied {
            let (worker_proxies, rewritten) = proxied(&stage.endpoints).await?;
            proxies.push(worker_proxies);
            rewritten
        } else {
            stage.endpoints.clone()
        };
        specs.push(WorkerArgs {
            backend,
            endpoints,
            postgres: postgres.to_owned(),
            run: run.clone(),
            client: client_name(i),
            ttl: plan.ttl,
            hold: plan.hold,
            no_renewal: !plan.renewal,
            tls: stage.tls.clone(),
        });
    }
    let run_dir = logs.join(&run);
    std::fs::create_dir_all(&run_dir)?;
    let mut fleet = Fleet::start(
        specs,
        &run_dir,
        tokio::time::Instant::now() + args.run_timeout,
    )?;
    let staged = scenario
        .stage(backend, &mut fleet, &mut stage, &proxies)
        .await;
    let sections = fleet.stop().await;
    let finding: Finding = staged?;
    let verdict = checker::check(&sections);
    let counts = store.counts().await?;
    let lost_updates = LostUpdates::count(&sections, counts.fenced, counts.unfenced);
    Ok(Row {
        scenario,
        title: scenario.title(),
        backend: backend.name(),
        status: "ran",
        as_expected: scenario.met(backend, &verdict, lost_updates, &finding),
        verdict,
        lost_updates,
        expected: scenario.expected(backend),
        note: finding.note,
        seconds: 0.0,
    })
}

/// Options of `fencelock check-log`.
#[derive(Debug, Args)]
pub struct CheckLogArgs {
    /// A file of JSON lines, one critical section each:
    /// `{"client":"a","token":42,"start_ns":1,"end_ns":2,"write":{"Accepted":{"order":7}}}`
    /// (`"write"` may also be `"Rejected"` or `"Failed"`; optional fields:
    /// `"unfenced_written"`, `"lost_ns"`, `"release"`).
    log: PathBuf,
}

/// Prints the verdict as JSON; exits 1 if any stale write was accepted or any token went
/// backwards, 0 otherwise (overlaps alone are what fencing is for).
pub fn check_log(args: &CheckLogArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&args.log) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("fencelock check-log: {}: {err}", args.log.display());
            return ExitCode::from(2);
        }
    };
    let mut sections = Vec::new();
    for (number, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<checker::Section>(line) {
            Ok(section) => sections.push(section),
            Err(err) => {
                eprintln!("fencelock check-log: line {}: {err}", number + 1);
                return ExitCode::from(2);
            }
        }
    }
    let verdict = checker::check(&sections);
    match serde_json::to_string_pretty(&verdict) {
        Ok(json) => println!("{json}"),
        Err(err) => {
            eprintln!("fencelock check-log: {err}");
            return ExitCode::from(2);
        }
    }
    if verdict.stale_accepted > 0 || verdict.token_inversions > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The TLS flags a worker gets: the lock service's only if its endpoints were given (local
/// servers are plaintext), PostgreSQL's only if it was given.
fn worker_tls(
    given: &crate::endpoints::Endpoints,
    lock_service_given: bool,
) -> crate::security::BackendTls {
    let all = &given.tls;
    let mut tls = crate::security::BackendTls::default();
    if lock_service_given {
        tls.etcd_cacert.clone_from(&all.etcd_cacert);
        tls.etcd_cert.clone_from(&all.etcd_cert);
        tls.etcd_key.clone_from(&all.etcd_key);
        tls.etcd_user.clone_from(&all.etcd_user);
        tls.redis.clone_from(&all.redis);
    }
    if given.postgres.is_some() {
        tls.postgres_cacert.clone_from(&all.postgres_cacert);
        tls.postgres_cert.clone_from(&all.postgres_cert);
        tls.postgres_key.clone_from(&all.postgres_key);
    }
    tls
}
