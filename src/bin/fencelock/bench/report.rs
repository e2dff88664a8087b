//! The outputs of a run: a terminal table, JSON, and a report (HTML and Markdown) with SVG
//! charts.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::go_mutex::SUBJECT as GO;
use super::go_mutex::SUBJECT_THREE as GO_THREE;
use super::stats::{Cell, Renewal};
use super::targets::{Targets, on_off};
use super::{BenchArgs, BoxResult};

/// Where and how the run was made.
#[derive(Debug, Serialize)]
pub struct Environment {
    /// `quick` (the headline rows, the default) or `full` (`--full`).
    pub scope: super::plan::Scope,
    pub cpus: usize,
    pub os: String,
    pub servers: String,
    pub fsync: String,
    /// The local etcd fsyncs its WAL (`--fsync`): the disk then bounds the write rate,
    /// and the lock is measured against half the raw put rate too.
    pub etcd_fsync: bool,
    pub etcd: String,
    pub redis: String,
    pub postgres: String,
    pub mariadb: String,
    pub zookeeper: String,
    /// The Go peer of the etcd rows (Go's and the etcd client's versions), or "not used".
    pub go_peer: String,
    pub cell_duration_s: f64,
    pub fencelock: String,
}

pub fn environment(
    args: &BenchArgs,
    plan: &super::plan::Plan,
    targets: &Targets,
    versions: ServerVersions,
) -> Environment {
    Environment {
        scope: plan.scope,
        cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        servers: if targets.embedded {
            "local, started by fencelock bench (loopback)".into()
        } else {
            "given endpoints".into()
        },
        fsync: format!(
            "etcd fsync {}; redis without persistence; postgres fsync off; mariadb no log \
             flush at commit; zookeeper forceSync=no (local servers)",
            on_off(args.fsync)
        ),
        etcd_fsync: args.fsync,
        etcd: versions.etcd,
        redis: versions.redis,
        postgres: versions.postgres,
        mariadb: versions.mariadb,
        zookeeper: versions.zookeeper,
        go_peer: NOT_USED.into(),
        cell_duration_s: args.duration.as_secs_f64(),
        fencelock: env!("CARGO_PKG_VERSION").into(),
    }
}

/// The versions the servers of the run report of themselves ("not used" for a backend
/// the run leaves out; "unknown: <why>" when a server would not say).
#[derive(Debug)]
pub struct ServerVersions {
    pub etcd: String,
    pub redis: String,
    pub postgres: String,
    pub mariadb: String,
    /// Filled in by the caller (ZooKeeper's `srvr` answer).
    pub zookeeper: String,
}

const NOT_USED: &str = "not used";

/// The fewest held locks at which the resident-memory bar (<= 1 KiB per held etcd lock)
/// is checked: the full run's renewal row. Fewer leave the figure too noisy to bar.
const MEMORY_BAR_LOCKS: usize = 100_000;

impl ServerVersions {
    /// Asks each server: etcd's Status RPC, Redis's `INFO server`, PostgreSQL's
    /// `SHOW server_version`, MariaDB's `VERSION()`.
    pub async fn ask(
        etcd: Option<etcd_client::Client>,
        redis: Option<redis::aio::ConnectionManager>,
        postgres: Option<(&str, Option<&fencelock::TlsConfig>)>,
        mariadb: Option<&str>,
    ) -> Self {
        let unknown = |err: &dyn std::fmt::Display| format!("unknown: {err}");
        let etcd = match etcd {
            Some(mut client) => match client.status().await {
                Ok(status) => format!("etcd {}", status.version()),
                Err(err) => unknown(&err),
            },
            None => NOT_USED.into(),
        };
        let redis = match redis {
            Some(mut connection) => {
                let info: redis::RedisResult<String> = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut connection)
                    .await;
                match info {
                    Ok(info) => redis_version(&info),
                    Err(err) => unknown(&err),
                }
            }
            None => NOT_USED.into(),
        };
        let postgres = match postgres {
            Some((conn, tls)) => match fencelock::postgres::connect(conn, tls).await {
                Ok(client) => match client.query_one("SHOW server_version", &[]).await {
                    Ok(row) => format!("PostgreSQL {}", row.get::<_, String>(0)),
                    Err(err) => unknown(&err),
                },
                Err(err) => unknown(&err),
            },
            None => NOT_USED.into(),
        };
        let mariadb = match mariadb {
            Some(url) => mariadb_version(url)
                .await
                .unwrap_or_else(|err| unknown(&err)),
            None => NOT_USED.into(),
        };
        Self {
            etcd,
            redis,
            postgres,
            mariadb,
            zookeeper: NOT_USED.into(),
        }
    }

    /// One line for the terminal.
    pub fn line(&self) -> String {
        format!(
            "servers: {}; {}; {}; {}; {}",
            self.etcd, self.redis, self.postgres, self.mariadb, self.zookeeper
        )
    }
}

/// `MariaDB 10.11.6-MariaDB-0+deb12u1` (or a MySQL version), from `VERSION()`.
async fn mariadb_version(url: &str) -> BoxResult<String> {
    use mysql_async::prelude::Queryable;
    let mut conn = fencelock::mysql::connect(url, None).await?;
    let version: Option<String> = conn.query_first("SELECT VERSION()").await?;
    conn.disconnect().await?;
    let version = version.ok_or("VERSION() returned no row")?;
    Ok(if version.contains("MariaDB") {
        format!("MariaDB {version}")
    } else {
        format!("MySQL {version}")
    })
}

/// `redis 7.0.15` or `valkey 8.1.1`, from `INFO server` (Valkey also reports a
/// `redis_version` for compatibility: its own name and version come first).
fn redis_version(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    match (field("server_name"), field("valkey_version")) {
        (Some(name), Some(version)) => format!("{name} {version}"),
        _ => format!("redis {}", field("redis_version").unwrap_or("(no version)")),
    }
}

/// A ratio computed inside one run.
#[derive(Debug, Serialize)]
pub struct Ratio {
    pub what: String,
    pub value: f64,
}

/// A performance bar and whether this run meets it.
#[derive(Debug, Serialize)]
pub struct Bar {
    pub bar: String,
    pub measured: String,
    pub holds: bool,
}

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub environment: Environment,
    pub cells: Vec<Cell>,
    pub renewals: Vec<Renewal>,
    pub ratios: Vec<Ratio>,
    pub bars: Vec<Bar>,
}

impl Outcome {
    pub fn new(environment: Environment, cells: Vec<Cell>, renewals: Vec<Renewal>) -> Self {
        let mut outcome = Self {
            environment,
            cells,
            renewals,
            ratios: Vec::new(),
            bars: Vec::new(),
        };
        outcome.derive();
        outcome
    }

    fn cell(&self, workload: &str, subject: &str, concurrency: usize) -> Option<&Cell> {
        self.cells.iter().find(|c| {
            c.workload == workload && c.subject == subject && c.concurrency == concurrency
        })
    }

    fn concurrencies(&self, workload: &str) -> Vec<usize> {
        let mut all: Vec<usize> = self
            .cells
            .iter()
            .filter(|c| c.workload == workload)
            .map(|c| c.concurrency)
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Ratios and bars, from this run's cells only.
    fn derive(&mut self) {
        let mut ratios = Vec::new();
        let mut bars = Vec::new();
        for c in self.concurrencies("distinct keys") {
            let etcd = self.cell("distinct keys", "etcd", c);
            let bare = self.cell("ceiling", "etcd txn+delete", c);
            let rpc = self.cell("ceiling", "etcd Lock RPC", c);
            let redis = self.cell("distinct keys", "redis", c);
            let redis_bare = self.cell("ceiling", "redis SET NX PX+CAD", c);
            if let (Some(etcd), Some(bare)) = (etcd, bare) {
                let r = etcd.per_second / bare.per_second;
                ratios.push(ratio(
                    format!("etcd lock / bare txn+delete cycles/s, c={c}"),
                    r,
                ));
                bars.push(Bar {
                    bar: format!("etcd lock cycles/s >= 0.9x bare acquire txn + delete (c={c})"),
                    measured: format!(
                        "{r:.2}x ({:.0} vs {:.0}/s)",
                        etcd.per_second, bare.per_second
                    ),
                    holds: r >= 0.9,
                });
                if c == 1 {
                    #[allow(clippy::cast_precision_loss)]
                    let p = etcd.p50_us as f64 / bare.p50_us.max(1) as f64;
                    bars.push(Bar {
                        bar: "etcd uncontended p50 <= 1.2x bare cycle p50".into(),
                        measured: format!("{p:.2}x ({} vs {} us)", etcd.p50_us, bare.p50_us),
                        holds: p <= 1.2,
                    });
                }
            }
            if let (Some(etcd), Some(rpc)) = (etcd, rpc) {
                let r = etcd.per_second / rpc.per_second;
                ratios.push(ratio(
                    format!("etcd lock / etcd Lock RPC cycles/s, c={c}"),
                    r,
                ));
                // Parity where few tasks run (issue 38: the client path), and the lead of
                // group commit where requests queue (issue 22).
                let goal = if c <= 8 { 1.0 } else { 1.5 };
                bars.push(Bar {
                    bar: format!("etcd lock cycles/s >= {goal}x etcd's Lock RPC (c={c})"),
                    measured: format!(
                        "{r:.2}x ({:.0} vs {:.0}/s)",
                        etcd.per_second, rpc.per_second
                    ),
                    holds: r >= goal,
                });
            }
            // On 3 members, against each peer on the same cluster (bars where group commit
            // must lead: 64 tasks).
            let three = self.cell("distinct keys", "etcd 3 members", c);
            for (peer, name, label) in [
                (
                    self.cell("distinct keys", GO_THREE, c),
                    "Go concurrency.Mutex",
                    "Go's concurrency.Mutex",
                ),
                (
                    self.cell("ceiling", "etcd 3 members Lock RPC", c),
                    "etcd Lock RPC",
                    "etcd's Lock RPC",
                ),
            ] {
                let (Some(three), Some(peer)) = (three, peer) else {
                    continue;
                };
                let r = three.per_second / peer.per_second;
                ratios.push(ratio(
                    format!("etcd lock / {name} cycles/s, 3 members, c={c}"),
                    r,
                ));
                if c >= 64 {
                    bars.push(Bar {
                        bar: format!("etcd lock cycles/s >= 1.5x {label} on 3 members (c={c})"),
                        measured: format!(
                            "{r:.2}x ({:.0} vs {:.0}/s)",
                            three.per_second, peer.per_second
                        ),
                        holds: r >= 1.5,
                    });
                }
            }
            if let (Some(etcd), Some(go)) = (etcd, self.cell("distinct keys", GO, c)) {
                let r = etcd.per_second / go.per_second;
                ratios.push(ratio(
                    format!("etcd lock / Go concurrency.Mutex cycles/s, c={c}"),
                    r,
                ));
                // Parity at one and eight tasks (issue 38), twice Go's rate where
                // group commit batches 64 tasks' requests.
                let goal = if c <= 8 { 1.0 } else { 2.0 };
                bars.push(Bar {
                    bar: format!("etcd lock cycles/s >= {goal}x Go's concurrency.Mutex (c={c})"),
                    measured: format!("{r:.2}x ({:.0} vs {:.0}/s)", etcd.per_second, go.per_second),
                    holds: r >= goal,
                });
            }
            // The disk's limit: a lock cycle is two writes, so with fsync on its ceiling is
            // half the rate of raw puts from as many tasks (issue 22's analysis of c=8).
            if let (Some(etcd), Some(put)) = (etcd, self.cell("ceiling", "etcd put", c)) {
                let half = put.per_second / 2.0;
                let r = etcd.per_second / half;
                ratios.push(ratio(
                    format!("etcd lock / half the raw put rate (two writes a cycle), c={c}"),
                    r,
                ));
                if self.environment.etcd_fsync && c == 8 {
                    bars.push(Bar {
                        bar: "etcd lock cycles/s >= 0.9x half the raw put rate, fsync on (c=8)"
                            .into(),
                        measured: format!("{r:.2}x ({:.0} vs {half:.0}/s)", etcd.per_second),
                        holds: r >= 0.9,
                    });
                }
            }
            if let (Some(redis), Some(bare)) = (redis, redis_bare) {
                let r = redis.per_second / bare.per_second;
                ratios.push(ratio(
                    format!("redis lock / bare SET NX PX+CAD cycles/s, c={c}"),
                    r,
                ));
                // Issue 38's targets: 0.95x where the round trip dominates, 0.8x at 64
                // tasks, where the server saturates and the lock's extra work (the
                // token's INCR, the holder record, the waiters' check) weighs most.
                let goal = if c >= 64 { 0.8 } else { 0.95 };
                bars.push(Bar {
                    bar: format!("redis lock cycles/s >= {goal}x bare SET NX PX + CAD (c={c})"),
                    measured: format!(
                        "{r:.2}x ({:.0} vs {:.0}/s)",
                        redis.per_second, bare.per_second
                    ),
                    holds: r >= goal,
                });
            }
            if let (Some(zk), Some(kazoo)) = (
                self.cell("distinct keys", "zookeeper", c),
                self.cell("distinct keys", "zookeeper kazoo Lock", c),
            ) {
                ratios.push(ratio(
                    format!("zookeeper lock / Python kazoo Lock cycles/s, c={c}"),
                    zk.per_second / kazoo.per_second,
                ));
            }
            if let (Some(etcd), Some(zk)) = (etcd, self.cell("distinct keys", "zookeeper", c)) {
                ratios.push(ratio(
                    format!("etcd / zookeeper lock cycles/s, c={c}"),
                    etcd.per_second / zk.per_second,
                ));
            }
            if let (Some(etcd), Some(redis)) = (etcd, redis) {
                ratios.push(ratio(
                    format!("etcd / redis lock cycles/s, c={c}"),
                    etcd.per_second / redis.per_second,
                ));
            }
            if let (Some(etcd), Some(three)) =
                (etcd, self.cell("distinct keys", "etcd 3 members", c))
            {
                ratios.push(ratio(
                    format!("etcd lock on 3 members / 1 member cycles/s, c={c}"),
                    three.per_second / etcd.per_second,
                ));
            }
            if let (Some(etcd), Some(tls)) = (etcd, self.cell("distinct keys", "etcd TLS", c)) {
                ratios.push(ratio(
                    format!("etcd lock over mutual TLS / plaintext cycles/s, c={c}"),
                    tls.per_second / etcd.per_second,
                ));
            }
        }
        if let (Some(plain), Some(tls)) = (
            self.cell("connect", "etcd", 1),
            self.cell("connect", "etcd TLS", 1),
        ) {
            #[allow(clippy::cast_precision_loss)]
            let r = tls.p50_us as f64 / plain.p50_us.max(1) as f64;
            ratios.push(ratio(
                format!(
                    "etcd connect over mutual TLS / plaintext, p50 ({} vs {} us)",
                    tls.p50_us, plain.p50_us
                ),
                r,
            ));
        }
        for w in self.concurrencies("contended") {
            if let (Some(etcd), Some(go)) = (
                self.cell("contended", "etcd", w),
                self.cell("contended", GO, w),
            ) {
                let r = etcd.per_second / go.per_second;
                ratios.push(ratio(
                    format!("etcd lock / Go concurrency.Mutex cycles/s, contended, {w} waiters"),
                    r,
                ));
                if w == 8 {
                    bars.push(Bar {
                        bar:
                            "etcd lock cycles/s >= 10x Go's concurrency.Mutex, one name, 8 waiters"
                                .into(),
                        measured: format!(
                            "{r:.2}x ({:.0} vs {:.0}/s)",
                            etcd.per_second, go.per_second
                        ),
                        holds: r >= 10.0,
                    });
                }
            }
        }
        let put = self.cell("ceiling", "etcd put", 1).map(|c| c.p50_us);
        for w in self.concurrencies("handoff") {
            if let (Some(handoff), Some(put)) = (self.cell("handoff", "etcd", w), put) {
                #[allow(clippy::cast_precision_loss)]
                let r = handoff.p50_us as f64 / put.max(1) as f64;
                ratios.push(ratio(format!("etcd handoff p50 / put p50, {w} waiters"), r));
                bars.push(Bar {
                    bar: format!("etcd contended handoff p50 <= 3x raw put p50 ({w} waiters)"),
                    measured: format!("{r:.2}x ({} vs {} us)", handoff.p50_us, put),
                    holds: r <= 3.0,
                });
            }
            if let Some(handoff) = self.cell("handoff", "etcd", w) {
                bars.push(Bar {
                    bar: format!("etcd contended handoff p99 <= 10 ms ({w} waiters)"),
                    measured: format!("{:.1} ms", handoff.p99_us as f64 / 1000.0),
                    holds: handoff.p99_us <= 10_000,
                });
                if w == 8 {
                    bars.push(Bar {
                        bar: "etcd handoffs/s >= 1,000 with 8 waiters".into(),
                        measured: format!("{:.0}/s", handoff.per_second),
                        holds: handoff.per_second >= 1000.0,
                    });
                }
            }
        }
        for subject in ["etcd", "redis"] {
            if let (Some(plain), Some(fenced)) = (
                self.cell("plain write", subject, 1),
                self.cell("fenced write", subject, 1),
            ) {
                #[allow(clippy::cast_precision_loss)]
                let r = fenced.p50_us as f64 / plain.p50_us.max(1) as f64;
                ratios.push(ratio(
                    format!("{subject}: lock+fenced write+release / lock+plain write+release, p50"),
                    r,
                ));
            }
            if let (Some(plain), Some(fenced)) = (
                self.cell(super::mariadb::PLAIN, subject, 1),
                self.cell(super::mariadb::FENCED, subject, 1),
            ) {
                #[allow(clippy::cast_precision_loss)]
                let r = fenced.p50_us as f64 / plain.p50_us.max(1) as f64;
                ratios.push(ratio(
                    format!(
                        "{subject}: lock+fenced MariaDB write+release / lock+plain MariaDB \
                         write+release, p50"
                    ),
                    r,
                ));
            }
        }
        for wave in self.cells.iter().filter(|c| c.workload == "waves") {
            if let Some(per_cycle) = wave.writes_per_operation {
                ratios.push(ratio(
                    format!(
                        "{}: write requests per lock cycle, waves of {} locks",
                        wave.subject, wave.concurrency
                    ),
                    per_cycle,
                ));
                bars.push(Bar {
                    bar: format!(
                        "{} locks taken and released together cost < 2 write requests per cycle",
                        wave.concurrency
                    ),
                    measured: format!("{per_cycle:.3} per cycle, {:.0} cycles/s", wave.per_second),
                    holds: per_cycle < 2.0,
                });
            }
        }
        if let Some(renewal) = self.renewals.iter().find(|r| r.subject == "etcd") {
            bars.push(Bar {
                bar: format!(
                    "renewing {} held etcd locks is one keep-alive stream, not per lock",
                    renewal.locks
                ),
                measured: format!("{:.2} keep-alives/s", renewal.requests_per_second),
                holds: renewal.requests_per_second < 2.0,
            });
            // The memory bar is for the scale it was set at (the full run's 100,000 held
            // locks). At the quick run's 10,000 the process grows by some 10 MB, and what
            // the allocator keeps from earlier cells and the lock tables' doubling steps
            // move that by a third from run to run (523 to 1,501 bytes per lock measured,
            // the heap's own share steady at about 950): the figure is shown, not barred.
            let barred = renewal
                .resident_bytes_per_lock
                .filter(|_| renewal.locks >= MEMORY_BAR_LOCKS);
            if let Some(bytes) = barred {
                bars.push(Bar {
                    bar: format!(
                        "holding {} etcd locks costs <= 1 KiB of resident memory each",
                        renewal.locks
                    ),
                    measured: format!("{bytes:.0} bytes per lock"),
                    holds: bytes <= 1024.0,
                });
            }
        }
        self.ratios = ratios;
        self.bars = bars;
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let env = &self.environment;
        let _ = write!(
            out,
            "\nservers: {}; {}; {}; {}; {}\n",
            env.etcd, env.redis, env.postgres, env.mariadb, env.zookeeper
        );
        if env.go_peer != NOT_USED {
            let _ = writeln!(out, "Go concurrency.Mutex peer: {}", env.go_peer);
        }
        let _ = writeln!(
            out,
            "\n{:<14} {:<25} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}",
            "workload",
            "subject",
            "conc",
            "ops/s",
            "p50 us",
            "p90 us",
            "p99 us",
            "max us",
            "errors"
        );
        for c in &self.cells {
            let [workload, subject, rest @ ..] = c.columns();
            let _ = write!(out, "{workload:<14} {subject:<25}");
            for (value, width) in rest.iter().zip([5, 10, 9, 9, 9, 9, 6]) {
                let _ = write!(out, " {value:>width$}");
            }
            let _ = writeln!(out);
        }
        if !self.renewals.is_empty() {
            let _ = writeln!(out, "\nrenewal: locks held by one client");
            for r in &self.renewals {
                let _ = writeln!(
                    out,
                    "  {:<8} {:>6} locks for {:>5.1}s: {:>8.0} requests, {:>8.2}/s ({}); {} resident bytes per held lock",
                    r.subject,
                    r.locks,
                    r.seconds,
                    r.requests,
                    r.requests_per_second,
                    r.note,
                    r.resident_bytes_per_lock
                        .map_or_else(|| "n/a".to_owned(), |b| format!("{b:.0}"))
                );
            }
        }
        let _ = writeln!(out, "\nratios (same run)");
        for r in &self.ratios {
            let _ = writeln!(out, "  {:<70} {:>7.2}", r.what, r.value);
        }
        let _ = writeln!(out, "\nperformance bars");
        for b in &self.bars {
            let mark = if b.holds { "holds " } else { "MISSED" };
            let _ = writeln!(out, "  [{mark}] {} : {}", b.bar, b.measured);
        }
        out
    }

    /// `report.html`, `report.md` and their SVG charts in `dir`.
    pub fn write_report(&self, dir: &Path) -> BoxResult<()> {
        std::fs::create_dir_all(dir)?;
        let series = |metric: fn(&Cell) -> f64,
                      workload_filter: &[&str]|
         -> Vec<(String, Vec<(usize, f64)>)> {
            let mut out: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
            for c in self
                .cells
                .iter()
                .filter(|c| workload_filter.contains(&c.workload.as_str()))
            {
                let name = if c.workload == "ceiling" {
                    format!("ceiling: {}", c.subject)
                } else {
                    c.subject.clone()
                };
                match out.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, points)) => points.push((c.concurrency, metric(c))),
                    None => out.push((name, vec![(c.concurrency, metric(c))])),
                }
            }
            out
        };
        #[allow(clippy::cast_precision_loss)]
        let p50 = |c: &Cell| c.p50_us as f64;
        #[allow(clippy::cast_precision_loss)]
        let p99 = |c: &Cell| c.p99_us as f64;
        line_chart(
            &dir.join("throughput.svg"),
            "Lock + release cycles per second, distinct keys",
            "concurrency",
            "cycles/s (log)",
            &series(|c| c.per_second, &["distinct keys", "ceiling"]),
            true,
        )?;
        line_chart(
            &dir.join("latency-p50.svg"),
            "Lock + release latency p50 (us), distinct keys",
            "concurrency",
            "us (log)",
            &series(p50, &["distinct keys", "ceiling"]),
            true,
        )?;
        line_chart(
            &dir.join("latency-p99.svg"),
            "Lock + release latency p99 (us), distinct keys",
            "concurrency",
            "us (log)",
            &series(p99, &["distinct keys", "ceiling"]),
            true,
        )?;
        line_chart(
            &dir.join("handoff.svg"),
            "Handoff latency p50 (us): release to next holder running, one key",
            "waiters",
            "us (log)",
            &series(p50, &["handoff"]),
            true,
        )?;
        super::ratio_chart::draw(&dir.join("ratios.svg"), &self.peer_ratios())?;
        std::fs::write(dir.join("report.html"), super::html::page(self))?;
        let mut md = String::new();
        let _ = writeln!(md, "# fencelock bench report\n");
        let scope = match self.environment.scope {
            super::plan::Scope::Quick => {
                "the headline rows (the default; `--full` runs every cell)"
            }
            super::plan::Scope::Full => "every cell and bar (`--full`)",
        };
        let _ = writeln!(
            md,
            "This run: {scope}. Every backend runs through the same lock trait; ceilings are \
             measured in the same run. `report.html` shows the same with the charts.\n"
        );
        let _ = writeln!(
            md,
            "## Environment\n\n```json\n{}\n```\n",
            serde_json::to_string_pretty(&self.environment)?
        );
        let _ = writeln!(
            md,
            "## Performance bars\n\n| bar | measured | holds |\n|---|---|---|"
        );
        for b in &self.bars {
            let _ = writeln!(
                md,
                "| {} | {} | {} |",
                b.bar,
                b.measured,
                if b.holds { "yes" } else { "**no**" }
            );
        }
        let _ = writeln!(
            md,
            "\n## Charts\n\n![lock / peer ratios](ratios.svg)\n\n![throughput](throughput.svg)\n\n![p50](latency-p50.svg)\n\n![p99](latency-p99.svg)\n\n![handoff](handoff.svg)\n"
        );
        let _ = writeln!(md, "## Ratios (same run)\n\n| ratio | value |\n|---|---|");
        for r in &self.ratios {
            let _ = writeln!(md, "| {} | {:.2} |", r.what, r.value);
        }
        let _ = writeln!(
            md,
            "\n## All cells\n\n| workload | subject | conc | ops/s | p50 us | p90 us | p99 us | max us | errors |\n|---|---|---|---|---|---|---|---|---|"
        );
        for c in &self.cells {
            let _ = writeln!(md, "| {} |", c.columns().join(" | "));
        }
        if !self.renewals.is_empty() {
            let _ = writeln!(
                md,
                "\n## Renewal traffic\n\n| backend | locks held | seconds | requests | per second | what was counted | resident bytes per held lock |\n|---|---|---|---|---|---|---|"
            );
            for r in &self.renewals {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.1} | {:.0} | {:.2} | {} | {} |",
                    r.subject,
                    r.locks,
                    r.seconds,
                    r.requests,
                    r.requests_per_second,
                    r.note,
                    r.resident_bytes_per_lock
                        .map_or_else(|| "n/a".to_owned(), |b| format!("{b:.0}"))
                );
            }
        }
        let _ = writeln!(
            md,
            "\nThe Redis token is a counter that can repeat after a failover, and Redlock's is the largest of independent counters; only etcd's create revision is a fencing token storage can fully rely on (see docs/redis.md)."
        );
        std::fs::write(dir.join("report.md"), md)?;
        Ok(())
    }
}

impl Outcome {
    /// The ratios of a lock to its peer or ceiling on cycles per second (higher is
    /// better: 1.0 is parity), for the ratio chart.
    pub fn peer_ratios(&self) -> Vec<(String, f64)> {
        self.ratios
            .iter()
            .filter(|r| r.what.contains(" lock / ") && r.what.contains("cycles/s"))
            .map(|r| (r.what.replace(" cycles/s", ""), r.value))
            .collect()
    }
}

fn ratio(what: String, value: f64) -> Ratio {
    Ratio { what, value }
}

/// Distinct colours, one per series (a chart has at most a dozen or so).
pub(super) const COLORS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 0),
    RGBColor(127, 127, 127),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(174, 199, 232),
];

/// `1.2M`, `35k`, `1.5k`, `640`, `2.5`: tick labels a person reads at a glance.
fn human(value: f64) -> String {
    let (scaled, unit) = if value >= 1e6 {
        (value / 1e6, "M")
    } else if value >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = if scaled >= 10.0 || (scaled - scaled.round()).abs() < 0.05 {
        format!("{scaled:.0}")
    } else {
        format!("{scaled:.1}")
    };
    format!("{text}{unit}")
}

/// Tick values 1, 2, 5, 10, 20, 50, ... between `low` and `high`: on a log axis spanning
/// a decade or two, powers of ten alone leave most of the data unlabelled.
fn one_two_five(low: f64, high: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(low.max(1e-9).log10().floor());
    while decade <= high {
        for step in [1.0, 2.0, 5.0] {
            let tick = decade * step;
            if (low..=high).contains(&tick) {
                ticks.push(tick);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// One line per series over categorical x values (the concurrencies), with markers; the
/// legend sits to the right of the plot, never over data. Ceilings (series named
/// `ceiling: ...`) are dashed with hollow markers, the subjects solid. `log` puts the
/// y axis on a log scale fitted to the data.
fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(usize, f64)>)],
    log: bool,
) -> BoxResult<()> {
    let mut xs: Vec<usize> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .collect();
    xs.sort_unstable();
    xs.dedup();
    if xs.is_empty() {
        return Ok(());
    }
    let index = |x: usize| xs.iter().position(|v| *v == x).unwrap_or(0);
    let values = || series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y));
    let y_max = values().fold(1.0_f64, f64::max);
    let y_min = values().filter(|y| *y > 0.0).fold(y_max, f64::min);
    #[allow(clippy::cast_precision_loss)]
    let x_range = -0.3..(xs.len() as f64 - 0.7);
    let root = SVGBackend::new(path, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot_area, legend_area) = root.split_horizontally(800);
    let labels = xs.clone();
    let x_label = move |x: &f64| {
        let i = x.round();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = i.max(0.0) as usize;
        if (x - x.round()).abs() < 1e-6 {
            labels.get(i).map(ToString::to_string).unwrap_or_default()
        } else {
            String::new()
        }
    };
    let points = |p: &[(usize, f64)]| -> Vec<(f64, f64)> {
        #[allow(clippy::cast_precision_loss)]
        p.iter()
            .map(|(x, y)| (index(*x) as f64, y.max(y_min)))
            .collect()
    };
    let style = |i: usize, name: &str| (COLORS[i % COLORS.len()], name.starts_with("ceiling"));
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_labels(xs.len() * 2 + 1)
                .x_label_formatter(&x_label)
                .y_label_formatter(&|y: &f64| human(*y))
                .x_desc(x_desc)
                .y_desc(y_desc)
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            for (i, (name, p)) in series.iter().enumerate() {
                let (color, ceiling) = style(i, name);
                let pts = points(p);
                if ceiling {
                    chart.draw_series(DashedLineSeries::new(
                        pts.clone(),
                        8,
                        5,
                        color.stroke_width(2),
                    ))?;
                    chart.draw_series(
                        pts.into_iter()
                            .map(|pt| Circle::new(pt, 4, color.stroke_width(2))),
                    )?;
                } else {
                    chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?;
                    chart.draw_series(
                        pts.into_iter().map(|pt| Circle::new(pt, 5, color.filled())),
                    )?;
                }
            }
        }};
    }
    let mut builder = ChartBuilder::on(&plot_area);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70);
    if log {
        let (low, high) = (y_min / 1.5, y_max * 1.5);
        draw!(
            builder.build_cartesian_2d(
                x_range,
                (low..high)
                    .log_scale()
                    .with_key_points(one_two_five(low, high))
            )?
        );
    } else {
        draw!(builder.build_cartesian_2d(x_range, 0.0..(y_max * 1.15))?);
    }
    // The legend, beside the plot.
    for (i, (name, _)) in series.iter().enumerate() {
        let (color, ceiling) = style(i, name);
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let y = 70 + 24 * i as i32;
        if ceiling {
            legend_area.draw(&PathElement::new(
                vec![(10, y), (20, y)],
                color.stroke_width(2),
            ))?;
            legend_area.draw(&PathElement::new(
                vec![(26, y), (36, y)],
                color.stroke_width(2),
            ))?;
            legend_area.draw(&Circle::new((23, y), 4, color.stroke_width(2)))?;
        } else {
            legend_area.draw(&PathElement::new(
                vec![(10, y), (36, y)],
                color.stroke_width(3),
            ))?;
            legend_area.draw(&Circle::new((23, y), 5, color.filled()))?;
        }
        legend_area.draw(&Text::new(name.clone(), (44, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::redis_version;
    use super::{Cell, Environment, Outcome};

    fn environment(etcd_fsync: bool) -> Environment {
        Environment {
            scope: crate::bench::plan::Scope::Full,
            cpus: 2,
            os: String::new(),
            servers: String::new(),
            fsync: String::new(),
            etcd_fsync,
            etcd: String::new(),
            redis: String::new(),
            postgres: String::new(),
            mariadb: String::new(),
            zookeeper: String::new(),
            go_peer: String::new(),
            cell_duration_s: 1.0,
            fencelock: String::new(),
        }
    }

    fn cell(workload: &str, subject: &str, concurrency: usize, per_second: f64) -> Cell {
        Cell {
            workload: workload.into(),
            subject: subject.into(),
            concurrency,
            operations: 1,
            errors: 0,
            seconds: 1.0,
            per_second,
            p50_us: 1,
            p90_us: 1,
            p99_us: 1,
            max_us: 1,
            writes_per_operation: None,
        }
    }

    /// The bars of a run of the etcd lock at 8 and 64 tasks beside its peers and 8 tasks'
    /// raw puts, by name: whether each holds.
    fn bars(etcd_fsync: bool, lock_at_8: f64) -> Vec<(String, bool)> {
        let cells = vec![
            cell("distinct keys", "etcd", 8, lock_at_8),
            cell("distinct keys", super::GO, 8, 1000.0),
            cell("ceiling", "etcd Lock RPC", 8, 1000.0),
            cell("ceiling", "etcd put", 8, 2000.0),
            cell("distinct keys", "etcd", 64, 3000.0),
            cell("distinct keys", super::GO, 64, 1600.0),
        ];
        Outcome::new(environment(etcd_fsync), cells, Vec::new())
            .bars
            .into_iter()
            .map(|bar| (bar.bar, bar.holds))
            .collect()
    }

    #[test]
    fn the_bars_ask_parity_at_eight_tasks_twice_go_at_64_and_the_disk_limit_with_fsync() {
        let at_parity = bars(true, 1000.0);
        let holds = |bars: &[(String, bool)], name: &str| {
            bars.iter()
                .find(|(bar, _)| bar.contains(name))
                .map(|(_, holds)| *holds)
        };
        assert_eq!(
            holds(&at_parity, "1x Go's concurrency.Mutex (c=8)"),
            Some(true)
        );
        assert_eq!(holds(&at_parity, "1x etcd's Lock RPC (c=8)"), Some(true));
        // 3000 / 1600 = 1.9x Go at 64 tasks: short of twice.
        assert_eq!(
            holds(&at_parity, "2x Go's concurrency.Mutex (c=64)"),
            Some(false)
        );
        // Half of 2000 puts/s is 1000: parity holds 0.9x.
        assert_eq!(holds(&at_parity, "half the raw put rate"), Some(true));
        let below = bars(true, 850.0);
        assert_eq!(
            holds(&below, "1x Go's concurrency.Mutex (c=8)"),
            Some(false)
        );
        assert_eq!(holds(&below, "half the raw put rate"), Some(false));
        // Without fsync the disk bounds nothing: no such bar.
        assert_eq!(holds(&bars(false, 1000.0), "half the raw put rate"), None);
    }

    /// The resident-memory bar of a renewal row of `locks` etcd locks at `bytes` each, if
    /// the run has one: whether it holds.
    fn memory_bar(locks: usize, bytes: f64) -> Option<bool> {
        let renewal = super::Renewal {
            subject: "etcd".into(),
            locks,
            seconds: 1.0,
            requests: 1.0,
            requests_per_second: 1.0,
            resident_bytes_per_lock: Some(bytes),
            note: String::new(),
        };
        Outcome::new(environment(false), Vec::new(), vec![renewal])
            .bars
            .into_iter()
            .find(|bar| bar.bar.contains("resident memory"))
            .map(|bar| bar.holds)
    }

    #[test]
    fn the_memory_bar_is_checked_at_100_000_held_locks_not_at_the_quick_runs_10_000() {
        assert_eq!(memory_bar(100_000, 949.0), Some(true));
        assert_eq!(memory_bar(100_000, 1_291.0), Some(false));
        assert_eq!(memory_bar(10_000, 1_348.0), None);
        // The keep-alive bar stays at any count.
        let renewal = super::Renewal {
            subject: "etcd".into(),
            locks: 10_000,
            seconds: 5.0,
            requests: 2.0,
            requests_per_second: 0.4,
            resident_bytes_per_lock: Some(1_348.0),
            note: String::new(),
        };
        let bars = Outcome::new(environment(false), Vec::new(), vec![renewal]).bars;
        assert!(
            bars.iter()
                .any(|bar| bar.bar.contains("one keep-alive stream") && bar.holds)
        );
    }

    #[test]
    fn redis_and_valkey_name_themselves() {
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(redis_version(redis), "redis 7.0.15");
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n";
        assert_eq!(redis_version(valkey), "valkey 8.1.1");
        assert_eq!(redis_version(""), "redis (no version)");
    }

    #[test]
    fn log_ticks_go_one_two_five() {
        assert_eq!(
            super::one_two_five(130.0, 2_700.0),
            [200.0, 500.0, 1_000.0, 2_000.0]
        );
    }

    #[test]
    fn tick_labels_read_at_a_glance() {
        assert_eq!(super::human(100_000.0), "100k");
        assert_eq!(super::human(1_500.0), "1.5k");
        assert_eq!(super::human(2_000_000.0), "2M");
        assert_eq!(super::human(640.0), "640");
        assert_eq!(super::human(2.5), "2.5");
    }
}
