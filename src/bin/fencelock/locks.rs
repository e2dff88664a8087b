//! `fencelock locks`: who holds which etcd lock, with which token and lease, and who waits
//! behind them, in queue order (a table, or JSON with `--json`); on Redis, as far as Redis
//! can tell: the holder's owner value, its record and remaining `PX`, and the last token
//! handed out (waiters leave no trace there); on Redlock, the same put together from the
//! masters (which hold each owner value, and whether a majority does); on ZooKeeper, every contender's node in queue order,
//! with its czxid token and session.
//!
//! JSON schema (`--json`, etcd):
//!
//! ```text
//! {"namespace": "fencelock", "revision": 1234,
//!  "locks": [{"name": "report",
//!             "holders": [ENTRY, ...],    // 1 for a lock, up to N for a semaphore
//!             "waiters": [ENTRY, ...]}]}  // first in line first
//! ENTRY = {"key": "...", "token": 1200, "lease_id": 7587882461712113669,
//!          "lease_remaining_s": 8, "lease_ttl_s": 10,  // null: no lease, or just expired
//!          "role": "lock" | "reader" | "writer" | "permit" | "candidate",
//!          "permits": 3,                               // permits only
//!          "value": "host-a:8080",                     // candidates only (lossy UTF-8)
//!          "writes_since": 34,                         // store writes since the key was made
//!          "holder": HOLDER | null}                    // its record (null: Go's keys, ...)
//! HOLDER = {"host": ..., "pid": ..., "program": ..., "since": ..., "since_unix_ms": ...,
//!           "ttl_ms": ..., "label": ...}               // see holder_json
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use fencelock::LockError;
use fencelock::etcd::{EtcdLocker, LockState, QueueEntry, Role};
use fencelock::redis::{RedisLockState, RedisLocker, RedlockLockState, RedlockLocker};
use fencelock::zookeeper::{ZooKeeperEntry, ZooKeeperLockState, ZooKeeperLocker};
use serde_json::{Value, json};

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LocksBackend {
    /// etcd: holders and waiters, in queue order.
    Etcd,
    /// A single Redis server: holders only.
    Redis,
    /// Redlock's masters (--redlock): holders only, with the masters holding each.
    Redlock,
    /// A ZooKeeper ensemble: holders and waiters, in queue order.
    Zookeeper,
}

/// Options of `fencelock locks`.
#[derive(Debug, Args)]
pub struct LocksArgs {
    /// Only this lock (default: every lock of the namespace that has a key).
    #[arg(long)]
    lock: Option<String>,
    /// Which lock service to look at.
    #[arg(long, value_enum, default_value_t = LocksBackend::Etcd, env = "FENCELOCK_BACKEND")]
    backend: LocksBackend,
    #[command(flatten)]
    service: crate::service::ServiceArgs,
    /// The independent Redis masters, for --backend redlock (comma-separated).
    #[arg(long, value_delimiter = ',', env = "FENCELOCK_REDLOCK")]
    redlock: Vec<String>,
    /// Print JSON instead of a table (schema in docs/operating.md).
    #[arg(long)]
    json: bool,
    /// The newest fencing token your storage has accepted (for example the largest
    /// token in its fence table): warn, and exit 1, if the lock service's history is
    /// behind it (restored from an older copy, or rebuilt empty), for then every grant
    /// until it catches up carries a token storage has already seen. etcd: checked
    /// against the store's current revision; ZooKeeper: against a zxid it assigns now;
    /// Redis (with --lock): against the lock's counter.
    #[arg(long)]
    newest_token: Option<u64>,
}

/// What `fencelock locks` found: the report, and what `--newest-token` found wrong.
struct Found {
    report: String,
    behind: Option<String>,
}

/// Exit 0 with the report; 1 when `--newest-token` finds the lock service's history
/// behind it; 2 for invalid arguments; 70 when the lock service cannot be read.
pub async fn locks(args: LocksArgs) -> ExitCode {
    match report(&args).await {
        Ok(Found { report, behind }) => {
            print!("{report}");
            match behind {
                Some(warning) => {
                    eprintln!("fencelock locks: warning: {warning}");
                    ExitCode::from(1)
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err((code, message)) => {
            eprintln!("fencelock locks: {message}");
            ExitCode::from(code)
        }
    }
}

async fn report(args: &LocksArgs) -> Result<Found, (u8, String)> {
    let failed = |err: LockError| {
        let code = if err.is_invalid_input() { 2 } else { 70 };
        (code, err.to_string())
    };
    if let Some(name) = &args.lock {
        fencelock::validate_name(name).map_err(failed)?;
    }
    if args.backend == LocksBackend::Redis {
        if args.newest_token.is_some() && args.lock.is_none() {
            return Err((
                2,
                "--newest-token on Redis needs --lock: each lock has a counter of its own".into(),
            ));
        }
        return redis_report(args).await.map_err(failed);
    }
    if args.backend == LocksBackend::Redlock {
        if args.newest_token.is_some() {
            return Err((
                2,
                "--newest-token: Redlock's token is not a fencing token (the largest of the \
                 masters' counters); there is no history to check"
                    .into(),
            ));
        }
        if args.redlock.is_empty() {
            return Err((
                2,
                "--backend redlock needs its masters: --redlock URL,URL,URL".into(),
            ));
        }
        return redlock_report(args).await.map_err(failed);
    }
    if args.backend == LocksBackend::Zookeeper {
        return zookeeper_report(args).await.map_err(failed);
    }
    let config = args.service.etcd_config().map_err(|err| (2, err))?;
    let locks = EtcdLocker::connect(config).await.map_err(failed)?;
    let states = match &args.lock {
        Some(name) => vec![locks.inspect(name).await.map_err(failed)?],
        None => locks.inspect_all().await.map_err(failed)?,
    };
    let behind = match args.newest_token {
        Some(newest) => {
            let current = locks.current_revision().await.map_err(failed)?;
            (newest > current).then(|| {
                history_behind(
                    &format!("etcd's current revision is {current}"),
                    newest,
                    "docs/etcd.md",
                )
            })
        }
        None => None,
    };
    let _ = locks.close().await;
    let report = if args.json {
        json_report(&args.service.namespace, &states)
    } else {
        table(&states)
    };
    Ok(Found { report, behind })
}

/// The warning for a lock service whose history is behind a token storage has seen.
fn history_behind(state: &str, newest: u64, docs: &str) -> String {
    format!(
        "{state}, which is not past token {newest} that your storage has seen: the lock \
         service's history is behind it (restored from an older copy, or rebuilt empty). \
         Until it passes {newest}, every grant carries a token your storage has already \
         seen: a strict fence refuses them all, and a fence that accepts equal tokens lets \
         a second holder of token {newest} through. See {docs}, \"What the token needs\"."
    )
}

fn role(entry: &QueueEntry) -> (&'static str, Option<usize>, Option<String>) {
    match &entry.role {
        Role::Lock => ("lock", None, None),
        Role::Reader => ("reader", None, None),
        Role::Writer => ("writer", None, None),
        Role::Permit { permits } => ("permit", Some(*permits), None),
        Role::Candidate { value } => (
            "candidate",
            None,
            Some(String::from_utf8_lossy(value).into_owned()),
        ),
        _ => ("other", None, None),
    }
}

fn entry_json(entry: &QueueEntry) -> Value {
    let (role, permits, value) = role(entry);
    let mut out = json!({
        "key": entry.key,
        "token": entry.token.get(),
        "lease_id": entry.lease_id,
        "lease_remaining_s": entry.lease_remaining.map(|d| d.as_secs()),
        "lease_ttl_s": entry.lease_ttl.map(|d| d.as_secs()),
        "role": role,
        "writes_since": entry.writes_since,
        "holder": entry.holder.as_ref().map(holder_json),
    });
    if let Some(permits) = permits {
        out["permits"] = json!(permits);
    }
    if let Some(value) = value {
        out["value"] = json!(value);
    }
    out
}

fn json_report(namespace: &str, states: &[LockState]) -> String {
    let revision = states.iter().map(|s| s.revision).max().unwrap_or(0);
    let locks: Vec<Value> = states
        .iter()
        .map(|state| {
            json!({
                "name": state.name,
                "holders": state.holders().map(entry_json).collect::<Vec<_>>(),
                "waiters": state.waiters().map(entry_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let report = json!({ "namespace": namespace, "revision": revision, "locks": locks });
    pretty(&report)
}

fn seconds(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{}s", d.as_secs()))
}

fn table(states: &[LockState]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if states.iter().all(|s| s.entries.is_empty()) {
        out.push_str("no lock is held or waited for\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<24} {:<9} {:<10} {:>10} {:<18} {:>9} {:>7}  key",
        "lock", "role", "state", "token", "lease", "ttl left", "age"
    );
    for state in states {
        let mut queued = 0;
        for entry in &state.entries {
            let (role, permits, value) = role(entry);
            let role = match (permits, value) {
                (Some(n), _) => format!("{role}/{n}"),
                (_, Some(v)) => format!("{role}={v}"),
                _ => role.to_owned(),
            };
            let position = if entry.holds {
                "holds".to_owned()
            } else {
                queued += 1;
                format!("waits #{queued}")
            };
            let ttl = format!(
                "{}/{}",
                seconds(entry.lease_remaining),
                seconds(entry.lease_ttl)
            );
            let _ = writeln!(
                out,
                "{:<24} {:<9} {:<10} {:>10} {:<18x} {:>9} {:>7}  {}",
                state.name,
                role,
                position,
                entry.token.get(),
                entry.lease_id,
                ttl,
                entry.writes_since,
                entry.key
            );
            if let Some(who) = who(entry.holder.as_ref(), None) {
                let _ = writeln!(out, "{:<24} {who}", "");
            }
        }
    }
    out.push_str(
        "(age: writes to etcd since the key was created; etcd keeps no time with a key)\n",
    );
    out
}

async fn redis_report(args: &LocksArgs) -> Result<Found, LockError> {
    let config = args.service.redis_config([args.service.redis.clone()]);
    let locks = RedisLocker::connect(config).await?;
    let states = match &args.lock {
        Some(name) => locks.inspect(name).await?,
        None => locks.inspect_all().await?,
    };
    let behind = match (args.newest_token, &args.lock) {
        (Some(newest), Some(name)) => {
            let last = locks.last_token(name).await?;
            last.is_none_or(|last| last < newest).then(|| {
                let counter = last.map_or_else(
                    || "the lock's token counter is gone".to_owned(),
                    |last| format!("the lock's token counter is at {last}"),
                );
                history_behind(&counter, newest, "docs/redis.md")
            })
        }
        _ => None,
    };
    let report = if args.json {
        redis_json(&args.service.namespace, &states)
    } else {
        redis_table(&states)
    };
    Ok(Found { report, behind })
}

fn redis_json(prefix: &str, states: &[RedisLockState]) -> String {
    let locks: Vec<Value> = states
        .iter()
        .map(|state| {
            let holders: Vec<Value> = state
                .holders
                .iter()
                .map(|h| {
                    json!({
                        "key": h.key,
                        "owner": h.owner,
                        "remaining_ms": h.remaining.map(millis),
                        "holder": h.holder.as_ref().map(holder_json),
                    })
                })
                .collect();
            json!({
                "name": state.name,
                "semaphore": state.semaphore,
                "holders": holders,
                "last_token": state.last_token,
                "waiters": Value::Null,
            })
        })
        .collect();
    let report = json!({
        "backend": "redis",
        "prefix": prefix,
        "locks": locks,
        "waiters_visible": false,
    });
    pretty(&report)
}

fn redis_table(states: &[RedisLockState]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if states.iter().all(|s| s.holders.is_empty()) {
        out.push_str("no lock is held\n");
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<7} {:>10} {:>9}  {:<40} key",
            "lock", "role", "last token", "ttl left", "owner"
        );
        for state in states {
            for holder in &state.holders {
                let _ = writeln!(
                    out,
                    "{:<24} {:<7} {:>10} {:>9}  {:<40} {}",
                    state.name,
                    if state.semaphore { "permit" } else { "lock" },
                    token_cell(state.last_token),
                    millis_cell(holder.remaining),
                    holder.owner,
                    holder.key
                );
                if let Some(who) = who(holder.holder.as_ref(), None) {
                    let _ = writeln!(out, "{:<24} `- {who}", "");
                }
            }
        }
    }
    out.push_str(
        "(Redis keeps no queue: waiters are not visible. last token: the last one the lock's \
         counter handed out, at least the holder's.)\n",
    );
    out
}

/// A `--json` report: pretty-printed, one line break after.
fn pretty(report: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(report).unwrap_or_default()
    )
}

/// A table cell: a token, or `-`.
fn token_cell(token: Option<u64>) -> String {
    token.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// A table cell: milliseconds left, or `-`.
fn millis_cell(left: Option<Duration>) -> String {
    left.map_or_else(|| "-".to_owned(), |d| format!("{}ms", d.as_millis()))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn redlock_report(args: &LocksArgs) -> Result<Found, LockError> {
    let config = args.service.redis_config(args.redlock.clone());
    let locks = RedlockLocker::connect(config).await?;
    let states = match &args.lock {
        Some(name) => {
            let state = locks.inspect(name).await?;
            if state.holders.is_empty() && state.unreachable.is_empty() {
                Vec::new()
            } else {
                vec![state]
            }
        }
        None => locks.inspect_all().await?,
    };
    let report = if args.json {
        redlock_json(&args.service.namespace, locks.quorum(), &states)
    } else {
        redlock_table(&states)
    };
    Ok(Found {
        report,
        behind: None,
    })
}

/// `{"backend": "redlock", "prefix": ..., "quorum": 2, "locks": [{"name": ...,
/// "holders": [{"owner": ..., "masters": [ADDRESS, ...], "quorum": true,
/// "undecided": false, "remaining_ms": ..., "holder": HOLDER | null}], "last_token": ..., "unreachable":
/// [ADDRESS, ...], "waiters": null}], "waiters_visible": false}`.
fn redlock_json(prefix: &str, quorum: usize, states: &[RedlockLockState]) -> String {
    let locks: Vec<Value> = states
        .iter()
        .map(|state| {
            let holders: Vec<Value> = state
                .holders
                .iter()
                .map(|h| {
                    json!({
                        "owner": h.owner,
                        "masters": h.masters,
                        "quorum": h.quorum,
                        "undecided": h.undecided,
                        "remaining_ms": h.remaining.map(millis),
                        "holder": h.holder.as_ref().map(holder_json),
                    })
                })
                .collect();
            json!({
                "name": state.name,
                "holders": holders,
                "last_token": state.last_token,
                "unreachable": state.unreachable,
                "waiters": Value::Null,
            })
        })
        .collect();
    let report = json!({
        "backend": "redlock",
        "prefix": prefix,
        "quorum": quorum,
        "locks": locks,
        "waiters_visible": false,
    });
    pretty(&report)
}

fn redlock_table(states: &[RedlockLockState]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if states.iter().all(|s| s.holders.is_empty()) {
        out.push_str("no lock is held\n");
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:>10} {:>9}  {:<34} masters",
            "lock", "state", "last token", "ttl left", "owner"
        );
        for state in states {
            for holder in &state.holders {
                let _ = writeln!(
                    out,
                    "{:<24} {:<9} {:>10} {:>9}  {:<34} {}",
                    state.name,
                    if holder.quorum {
                        "holds"
                    } else if holder.undecided {
                        "unknown"
                    } else {
                        "partial"
                    },
                    token_cell(state.last_token),
                    millis_cell(holder.remaining),
                    holder.owner,
                    holder.masters.join(",")
                );
                if let Some(who) = who(holder.holder.as_ref(), None) {
                    let _ = writeln!(out, "{:<24} `- {who}", "");
                }
            }
            if !state.unreachable.is_empty() {
                let _ = writeln!(
                    out,
                    "{:<24} unreachable: {}",
                    state.name,
                    state.unreachable.join(",")
                );
            }
        }
    }
    out.push_str(
        "(partial: held on fewer masters than a majority, so not held; unknown: the \
         masters that could not be read would make it a majority. ttl left: while a \
         majority still holds it. Redlock keeps no queue: waiters are not visible.)\n",
    );
    out
}

async fn zookeeper_report(args: &LocksArgs) -> Result<Found, LockError> {
    let config = args.service.zookeeper_config();
    let namespace = config.namespace().to_owned();
    let locks = ZooKeeperLocker::connect(config).await?;
    let states = match &args.lock {
        Some(name) => vec![locks.inspect(name).await?],
        None => locks.inspect_all().await?,
    };
    let behind = match args.newest_token {
        Some(newest) => {
            let now = locks.current_zxid().await?.get();
            (newest >= now).then(|| {
                history_behind(
                    &format!("ZooKeeper assigns zxid {now:#x} ({now}) now"),
                    newest,
                    "docs/zookeeper.md",
                )
            })
        }
        None => None,
    };
    let report = if args.json {
        zookeeper_json(&namespace, &states)
    } else {
        zookeeper_table(&states)
    };
    Ok(Found { report, behind })
}

/// `{"backend": "zookeeper", "namespace": "/fencelock", "locks": [{"name": ...,
/// "holders": [ENTRY], "waiters": [ENTRY, ...]}]}` with
/// `ENTRY = {"path": ..., "token": czxid, "session_id": ..., "role": "exclusive" |
/// "reader", "kind": "lock" | "reader" | "writer" | "kazoo-lock" | "kazoo-reader" |
/// "unknown"}` (readers of a read-write lock share it; `kind` names the recipe, and
/// other clients' nodes on the path are listed too); `"incompatible"` names the other
/// client's semaphore whose path fencelock refuses to share (`null` otherwise).
fn zookeeper_json(namespace: &str, states: &[ZooKeeperLockState]) -> String {
    let entry = |e: &ZooKeeperEntry| {
        json!({
            "path": e.path,
            "token": e.token.get(),
            "session_id": format!("{:#x}", e.session_id),
            "role": if e.reader { "reader" } else { "exclusive" },
            "kind": e.kind.as_str(),
            "holder": e.holder.as_ref().map(holder_json),
            "data": e.data,
        })
    };
    let locks: Vec<Value> = states
        .iter()
        .map(|state| {
            let (holders, waiters): (Vec<_>, Vec<_>) = state.entries.iter().partition(|e| e.holds);
            json!({
                "name": state.name,
                "holders": holders.into_iter().map(entry).collect::<Vec<_>>(),
                "waiters": waiters.into_iter().map(entry).collect::<Vec<_>>(),
                "incompatible": state.incompatible,
            })
        })
        .collect();
    let report = json!({ "backend": "zookeeper", "namespace": namespace, "locks": locks });
    pretty(&report)
}

/// `{"host": ..., "pid": ..., "program": ..., "since": "2026-12-02T14:02:11Z" (the
/// holder's clock), "since_unix_ms": ..., "ttl_ms": ..., "label": ...}`.
fn holder_json(holder: &fencelock::HolderInfo) -> Value {
    let since = holder
        .since
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    json!({
        "host": holder.host,
        "pid": holder.pid,
        "program": holder.program,
        "since": humantime::format_rfc3339_seconds(holder.since).to_string(),
        "since_unix_ms": u64::try_from(since.as_millis()).unwrap_or(u64::MAX),
        "ttl_ms": u64::try_from(holder.ttl.as_millis()).unwrap_or(u64::MAX),
        "label": holder.label,
    })
}

/// The line under an entry that says who it is: its holder record, or another client's
/// data (kazoo's identifier, Curator's address).
fn who(holder: Option<&fencelock::HolderInfo>, data: Option<&str>) -> Option<String> {
    match (holder, data) {
        (Some(holder), _) => Some(holder.describe(std::time::SystemTime::now())),
        (None, Some(data)) => Some(format!("data {data:?}")),
        (None, None) => None,
    }
}

fn zookeeper_table(states: &[ZooKeeperLockState]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if states
        .iter()
        .all(|s| s.entries.is_empty() && s.incompatible.is_none())
    {
        out.push_str("no lock is held or waited for\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<24} {:<10} {:<12} {:>14} {:<18}  node",
        "lock", "state", "kind", "token (czxid)", "session"
    );
    for state in states {
        if let Some(recipe) = state.incompatible {
            let _ = writeln!(
                out,
                "{:<24} refused: its path is shared with {recipe}",
                state.name
            );
        }
        for (place, entry) in state.entries.iter().enumerate() {
            let position = if entry.holds {
                "holds".to_owned()
            } else {
                format!("waits #{place}")
            };
            let _ = writeln!(
                out,
                "{:<24} {:<10} {:<12} {:>14} {:<18x}  {}",
                state.name,
                position,
                entry.kind.as_str(),
                entry.token.get(),
                entry.session_id,
                entry.path
            );
            if let Some(who) = who(entry.holder.as_ref(), entry.data.as_deref()) {
                let _ = writeln!(out, "{:<24} `- {who}", "");
            }
        }
    }
    out
}
