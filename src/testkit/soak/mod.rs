//! A request-level fault soak for the etcd lock: many clients on a three-member cluster,
//! every one of their paths to every member behind a fault proxy, a nemesis that delays,
//! holds and later delivers, or cuts their requests, kills members, deletes keys as an
//! operator would, compacts and takes the clients' write permission away for a while, all on a schedule drawn from a seed; and an independent
//! checker that rebuilds the truth from etcd's own history and compares it with what
//! every client was told (`checker/mod.rs` lists the checks, one file per group).
//!
//! Scenario tests find the cases someone thought of; this finds the others. A failure
//! prints the seed (run it again with it: the schedule of choices repeats, the timing
//! does not always) and the history around each violation.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::testkit::soak::{SoakConfig, soak};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let report = soak(SoakConfig::new(7).with_duration(Duration::from_secs(30))).await?;
//! println!("{}", report.summary());
//! assert!(report.passed());
//! # Ok(()) }
//! ```

mod auth;
mod checker;
mod history;
mod nemesis;
mod rng;
mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::GetOptions;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{EtcdCluster, FaultProxy, TestkitError};
use crate::etcd::{EtcdConfig, EtcdLocker};
use rng::Rng;

/// How long the clients' tasks may take to finish once the run is over (an acquisition
/// waits at most 8 s, a hold lasts at most 2.5 TTLs): longer is a stall.
const FINISH_BOUND: Duration = Duration::from_secs(30);

/// How long after the run (faults healed, members back) the namespace may still hold
/// keys: the longest TTL plus retries. Longer is a key that outlived its acquisition.
const SETTLE_BOUND: Duration = Duration::from_secs(10);

/// How to run a soak.
#[derive(Clone, Debug)]
#[must_use]
pub struct SoakConfig {
    seed: u64,
    duration: Duration,
    clients: usize,
    tasks: usize,
    names: usize,
    binary: Option<PathBuf>,
}

impl SoakConfig {
    /// A soak whose every random choice derives from `seed`: 30 s, 4 clients of 3 tasks
    /// each, 3 lock names.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            duration: Duration::from_secs(30),
            clients: 4,
            tasks: 3,
            names: 3,
            binary: None,
        }
    }

    /// How long the workload and the nemesis run.
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// How many clients (each its own connection, sessions and fault proxies).
    pub fn with_clients(mut self, clients: usize) -> Self {
        self.clients = clients.max(1);
        self
    }

    /// How many tasks each client runs at once.
    pub fn with_tasks(mut self, tasks: usize) -> Self {
        self.tasks = tasks.max(1);
        self
    }

    /// How many lock names the tasks share.
    pub fn with_names(mut self, names: usize) -> Self {
        self.names = names.max(1);
        self
    }

    /// The etcd binary (default: `$FENCELOCK_ETCD_BIN`, else `etcd` on `PATH`).
    pub fn with_etcd_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }
}

/// What a soak did, and what its checker found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakReport {
    /// The seed: run again with it.
    pub seed: u64,
    /// How long the workload ran, in seconds.
    pub seconds: f64,
    /// What the clients did: acquisitions attempted, granted, busy (a `try` that found the
    /// lock taken), timed out, failed; releases by outcome; losses heard; of the
    /// acquisitions and grants, those of several locks at once (`multi acquisitions`,
    /// `multi grants`).
    pub operations: BTreeMap<String, u64>,
    /// Failed acquisitions by their error (lock names, numbers and durations left out),
    /// the most frequent first (at most eight).
    pub failures: Vec<(String, u64)>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Changes etcd recorded under the namespace (the checker's truth).
    pub history_events: usize,
    /// Checks made, by kind, and how many times.
    pub checked: BTreeMap<String, usize>,
    /// Every violation, with the history around it.
    pub violations: Vec<String>,
    /// Seconds from the start to the earliest violation, as near as the checker can
    /// date it (`None` without violations).
    pub first_violation_seconds: Option<f64>,
    /// Every fault, in order, with its time from the start.
    pub fault_log: Vec<String>,
}

impl SoakReport {
    /// Whether the checker found nothing.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A few lines for people; with the violations and the fault log if there are any.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut out = format!(
            "soak: seed {}, {:.0} s, {} etcd changes recorded\n",
            self.seed, self.seconds, self.history_events
        );
        let join = |map: &BTreeMap<String, u64>| {
            map.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!("operations: {}\n", join(&self.operations)));
        if !self.failures.is_empty() {
            let failures: Vec<String> = self
                .failures
                .iter()
                .map(|(error, n)| format!("{n} x {error}"))
                .collect();
            out.push_str(&format!("failures: {}\n", failures.join("; ")));
        }
        out.push_str(&format!(
            "faults ({} in all): {}\n",
            self.faults.values().sum::<u64>(),
            join(&self.faults)
        ));
        let checked: Vec<String> = self
            .checked
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        out.push_str(&format!("checked: {}\n", checked.join(", ")));
        if self.violations.is_empty() {
            out.push_str("violations: none\n");
        } else {
            out.push_str(&format!(
                "VIOLATIONS: {} (seed {})\n",
                self.violations.len(),
                self.seed
            ));
            for violation in &self.violations {
                out.push_str(&format!("- {violation}\n"));
            }
            out.push_str("fault log:\n");
            for line in &self.fault_log {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }
}

/// Runs a soak; see the module docs. Errors are the harness's own (a server that would
/// not start); everything the lock got wrong is in the report.
pub async fn soak(config: SoakConfig) -> Result<SoakReport, TestkitError> {
    let mut builder = EtcdCluster::builder().members(3);
    if let Some(binary) = &config.binary {
        builder = builder.binary(binary);
    }
    let cluster = builder.start().await?;
    let namespace = format!("soak-{}", config.seed);
    let admin = auth::enable(&cluster, &namespace).await?;
    let names: Arc<Vec<String>> = Arc::new((0..config.names).map(|i| format!("n{i}")).collect());
    let seeds = Rng::new(config.seed);

    // The truth, from revision 1.
    let record = Arc::new(history::Record::default());
    let (stop_recording, recording) = watch::channel(false);
    let (recorded_tx, recorded) = watch::channel(0);
    let recorder = tokio::spawn(history::record(
        admin.clone(),
        namespace.clone(),
        record.clone(),
        recorded_tx,
        recording,
    ));

    // Every client's path to every member behind a proxy of its own.
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..config.clients {
        let mut paths = Vec::new();
        for member in 0..cluster.len() {
            let address = cluster
                .endpoint(member)
                .trim_start_matches("http://")
                .parse()
                .map_err(|e| TestkitError::Cluster(format!("member address: {e}")))?;
            paths.push(
                FaultProxy::start(address)
                    .await
                    .map_err(|e| TestkitError::io("starting a fault proxy", e))?,
            );
        }
        let endpoints: Vec<String> = paths.iter().map(FaultProxy::http_url).collect();
        // Half the clients keep one request in flight, so that their tasks' requests of
        // different names batch as much as they can; the others keep the default.
        let in_flight = if lockers.len() % 2 == 0 {
            1
        } else {
            crate::etcd::EtcdConfig::new(["127.0.0.1:1"]).max_in_flight()
        };
        let config = EtcdConfig::new(endpoints)
            .with_namespace(&namespace)
            .with_connect_timeout(Duration::from_secs(5))
            .with_request_timeout(Duration::from_secs(1))
            .with_max_in_flight(in_flight)
            .with_credentials(auth::USER, auth::PASSWORD);
        lockers.push(
            EtcdLocker::connect(config)
                .await
                .map_err(|e| TestkitError::Cluster(format!("soak client: {e}")))?,
        );
        proxies.push(paths);
    }

    let started = Instant::now();
    let until = started + config.duration;
    let journal = Arc::new(workload::Journal::default());
    let tally = Arc::new(workload::Tally::default());
    let batched_before = crate::etcd::batched_so_far();
    let unanswered_before = crate::etcd::unanswered_so_far();
    // Which deletions in the history the clients made themselves, and when waits saw
    // their keys gone (one soak per process).
    let recording = crate::etcd::Recording::start();
    let (stop_work, working) = watch::channel(false);
    let mut tasks = JoinSet::new();
    for (client, locker) in lockers.iter().enumerate() {
        for task in 0..config.tasks {
            let stream = (client * config.tasks + task) as u64 + 1;
            tasks.spawn(workload::task(
                workload::Client {
                    client,
                    locker: locker.clone(),
                    journal: journal.clone(),
                    tally: tally.clone(),
                },
                names.clone(),
                seeds.fork(stream),
                working.clone(),
            ));
        }
    }
    let faults = Arc::new(nemesis::Faults::default());
    let targets = nemesis::Targets {
        cluster: Arc::new(tokio::sync::Mutex::new(cluster)),
        proxies: Arc::new(proxies),
        admin: admin.clone(),
        namespace: namespace.clone(),
        names: names.clone(),
        recorded: recorded.clone(),
    };
    let cluster = targets.cluster.clone();
    let proxies = targets.proxies.clone();
    nemesis::run(targets, seeds.fork(0), until, faults.clone()).await;

    // The end: tasks finish what they are doing; every fault is healed by now.
    stop_work.send_replace(true);
    let ended = Instant::now();
    let mut violations = Vec::new();
    let finished = tokio::time::timeout(FINISH_BOUND, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        violations.push(format!(
            "progress: {} client tasks had not finished {FINISH_BOUND:?} after the run ended",
            tasks.len()
        ));
        tasks.abort_all();
    }

    // Settle: no key may outlive its acquisition by more than the bound.
    let mut reader = admin.clone();
    let prefix = format!("{namespace}/");
    let settle_until = Instant::now() + SETTLE_BOUND;
    let left = loop {
        let read = reader
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await;
        let left: Vec<String> = match read {
            Ok(read) => read
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect(),
            Err(_) => vec!["(the namespace could not be read)".into()],
        };
        if left.is_empty() || Instant::now() >= settle_until {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // A marker after everything: once the recorder sees it, it has seen all before it.
    let marker = format!("{namespace}/~end");
    let mut recorded = recorded;
    let marked = tokio::time::timeout(Duration::from_secs(20), async {
        // (A member just restarted may refuse the first attempts.)
        let revision = loop {
            match reader.put(marker.as_str(), "", None).await {
                Ok(put) => break put.header().map_or(0, |h| h.revision()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let _ = recorded.wait_for(|seen| *seen >= revision).await;
    })
    .await;
    if marked.is_err() {
        violations.push("harness: the recorder did not catch up with the end marker".into());
    }
    stop_recording.send_replace(true);
    let _ = recorder.await;

    let history = record.snapshot();
    let events = journal.snapshot();
    let by_clients = recording.finish();
    let verdict = checker::check(
        &history,
        &events,
        &left,
        started..ended,
        &namespace,
        &checker::Operator {
            revisions: faults.operator_revisions(),
            unanswered: faults.unanswered(),
            revoked: faults.revoked(),
        },
        &by_clients,
    );
    violations.extend(verdict.violations);
    // The harness's own findings date from the run's end.
    let first_violation = verdict
        .first_at
        .or_else(|| (!violations.is_empty()).then_some(ended))
        .map(|at| at.saturating_duration_since(started).as_secs_f64());

    let operations = [
        ("acquisitions", &tally.attempts),
        ("granted", &tally.grants),
        ("busy", &tally.busy),
        ("timed out", &tally.timeouts),
        ("failed", &tally.errors),
        ("released", &tally.released),
        ("released, not held", &tally.not_held),
        ("released, unconfirmed", &tally.unconfirmed),
        ("dropped", &tally.dropped),
        ("losses heard", &tally.losses),
        // Of the acquisitions and grants: several locks at once (`lock_all`).
        ("multi acquisitions", &tally.multi_attempts),
        ("multi grants", &tally.multi_grants),
    ]
    .into_iter()
    .map(|(name, counter)| (name.to_owned(), counter.load(Ordering::Relaxed)))
    .collect::<BTreeMap<String, u64>>();
    let batched_after = crate::etcd::batched_so_far();
    let unanswered_after = crate::etcd::unanswered_so_far();
    // Requests whose outcome the library could not know: what the rules about spent
    // names and retired sessions were tested by.
    let mut operations = operations;
    operations.insert(
        "deletes unanswered".into(),
        unanswered_after.0 - unanswered_before.0,
    );
    operations.insert(
        "joins unanswered".into(),
        unanswered_after.1 - unanswered_before.1,
    );
    operations.insert(
        "joins adopted".into(),
        unanswered_after.2 - unanswered_before.2,
    );
    // Joins and releases of different names that rode together in one transaction.
    operations.insert("batches".into(), batched_after.0 - batched_before.0);
    operations.insert(
        "batched requests".into(),
        batched_after.1 - batched_before.1,
    );
    let report = SoakReport {
        failures: failures_by_error(&events),
        seed: config.seed,
        seconds: ended.duration_since(started).as_secs_f64(),
        operations,
        faults: faults
            .counts()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        history_events: history.len(),
        checked: verdict
            .checked
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        violations,
        first_violation_seconds: first_violation,
        fault_log: faults.log(started),
    };
    drop(lockers);
    drop(proxies);
    drop(cluster);
    Ok(report)
}

/// Failed acquisitions by error, the lock's name and every number left out, so that one
/// cause counts once: the most frequent eight.
fn failures_by_error(events: &[checker::Event]) -> Vec<(String, u64)> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for event in events {
        if let checker::Event::Failed { name, error, .. } = event {
            let general: String = error
                .replace(&format!("{name:?}"), "NAME")
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect();
            *counts.entry(general).or_default() += 1;
        }
    }
    let mut counts: Vec<(String, u64)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts.truncate(8);
    counts
}
