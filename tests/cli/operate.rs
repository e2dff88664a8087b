//! What an operator does in an incident, on every backend: `fencelock locks` says who
//! holds (host, pid, command, since when, label), `fencelock break` ends exactly the
//! stuck holder (its `run` job exits 76, the waiter is granted, and the broken holder's
//! fenced write is refused), a break with a stale token (or owner) deletes nothing and
//! says so, and `fencelock check` tells a current token from a superseded one.

use std::process::Stdio;
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::postgres::{Fence, FenceError};
use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::{EtcdCluster, PostgresServer, RedisServer, ZooKeeperCluster};
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::support::next_line;

/// `fencelock <subcommand> <service args>`: its exit status and its stdout and stderr.
async fn fencelock(
    subcommand: &str,
    service: &[String],
    extra: &[&str],
    stdin: &str,
) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg(subcommand)
        .args(service)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("fencelock");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write stdin");
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("fencelock finishes")
        .expect("output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// A `fencelock run` job that prints its token and then sleeps: started, and its token.
async fn job(service: &[String], lock: &str) -> (tokio::process::Child, FencingToken) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("run")
        .args(service)
        .args([
            "--lock",
            lock,
            "--ttl",
            "2s",
            "--label",
            "nightly-2026-12-02",
            "--",
        ])
        .args(["sh", "-c", "echo $FENCELOCK_TOKEN; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fencelock run");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let token = next_line(&mut lines).await.parse().expect("the token");
    (child, FencingToken::new(token))
}

/// Waits for the job to exit; its status.
async fn exit_of(mut job: tokio::process::Child) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(10), job.wait())
        .await
        .expect("the broken job exits")
        .expect("status")
        .code()
}

async fn fenced_write(
    db: &mut tokio_postgres::Client,
    token: FencingToken,
) -> Result<(), FenceError> {
    Fence::new().begin(db, "job", token).await?.commit().await
}

/// The whole incident on a backend whose holders are named by token.
async fn break_by_token<B: LockBackend + 'static>(service: Vec<String>, waiter: B) {
    let postgres = PostgresServer::start().await.expect("postgres");
    let database = postgres.create_database().await.expect("database");
    let mut db = postgres.connect(&database).await.expect("connect");
    Fence::new().ensure_schema(&db).await.expect("fence schema");

    let (stuck, stuck_token) = job(&service, "job").await;
    let waiting = tokio::spawn(async move { waiter.lock("job", &LockOptions::new()).await });
    let (code, out) = fencelock(
        "check",
        &service,
        &["--lock", "job", "--token", &stuck_token.to_string()],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");

    let (code, out) = fencelock(
        "break",
        &service,
        &[
            "--lock",
            "job",
            "--token",
            &stuck_token.to_string(),
            "--yes",
        ],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("broke the holder with token {stuck_token}")),
        "{out}"
    );
    assert_eq!(
        exit_of(stuck).await,
        Some(76),
        "the broken job knows it lost the lock"
    );
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted")
        .expect("task")
        .expect("lock");
    assert!(granted.token() > stuck_token);
    fenced_write(&mut db, granted.token())
        .await
        .expect("the new holder writes");
    let refused = fenced_write(&mut db, stuck_token).await;
    assert!(
        matches!(refused, Err(FenceError::Stale { .. })),
        "{refused:?}"
    );

    // The same break again: the holder has changed, and nothing is deleted.
    let (code, out) = fencelock(
        "break",
        &service,
        &[
            "--lock",
            "job",
            "--token",
            &stuck_token.to_string(),
            "--yes",
        ],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "token {} holds now): nothing deleted",
            granted.token()
        )),
        "{out}"
    );
    assert!(granted.is_held(), "a stale break touches nobody");
    let (code, out) = fencelock(
        "check",
        &service,
        &["--lock", "job", "--token", &stuck_token.to_string()],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("superseded: token {} holds", granted.token())),
        "{out}"
    );
    let _ = granted.release().await;
    let (code, out) = fencelock(
        "check",
        &service,
        &["--lock", "job", "--token", &stuck_token.to_string()],
        "",
    )
    .await;
    assert_eq!((code, out.trim()), (Some(1), "free: nobody holds the lock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_broken_job_exits_76_and_its_waiter_is_granted() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "operate";
    let waiter = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let service = vec![
        "--etcd".into(),
        etcd.endpoints().join(","),
        "--namespace".into(),
        ns.into(),
    ];
    break_by_token(service, waiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_a_broken_job_exits_76_and_its_waiter_is_granted() {
    let cluster = ZooKeeperCluster::shared();
    let ns = "/cli-operate";
    let waiter = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let service = vec![
        "--backend".into(),
        "zookeeper".into(),
        "--zookeeper".into(),
        cluster.connect_string(),
        "--namespace".into(),
        ns.into(),
    ];
    break_by_token(service, waiter).await;
}

/// Redis names a holder by its owner value: the operator runs `break` without one, is
/// shown the holder, and confirms. The job learns of it at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_job_broken_by_owner_exits_76_and_its_waiter_is_granted() {
    let redis = RedisServer::start().await.expect("redis");
    let service = vec![
        "--backend".into(),
        "redis".into(),
        "--redis".into(),
        redis.url(),
    ];
    let waiter = RedisLocker::connect(RedisConfig::new(redis.url()))
        .await
        .expect("connect");
    let (stuck, stuck_token) = job(&service, "job").await;
    let waiting = tokio::spawn(async move { waiter.lock("job", &LockOptions::new()).await });

    let (code, out) = fencelock("break", &service, &["--lock", "job"], "n\n").await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("holds: owner ") && out.contains("not confirmed"),
        "{out}"
    );
    // The holder described by the record after its owner value: `fencelock run`'s
    // command and label.
    assert!(out.contains(" sh label nightly-2026-12-02 key "), "{out}");
    let owner = out
        .split("holds: owner ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the owner shown")
        .to_owned();
    let (code, out) = fencelock("break", &service, &["--lock", "job"], "y\n").await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        exit_of(stuck).await,
        Some(76),
        "the broken job knows it lost the lock"
    );
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted")
        .expect("task")
        .expect("lock");
    assert!(granted.token() > stuck_token);

    // The broken holder's owner again: nothing to delete, and the new holder keeps it.
    let (code, out) = fencelock(
        "break",
        &service,
        &["--lock", "job", "--owner", &owner, "--yes"],
        "",
    )
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("nothing deleted"), "{out}");
    assert!(granted.is_held());
    let (code, out) = fencelock("check", &service, &["--lock", "job", "--owner", &owner], "").await;
    assert_eq!(code, Some(1), "{out}");
    // The new holder's value carries its record too: its owner alone is current.
    let (code, out) = fencelock(
        "check",
        &service,
        &["--lock", "job", "--owner", granted.owner()],
        "",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("current"), "{out}");
    let (code, out) = fencelock("check", &service, &["--lock", "job", "--token", "3"], "").await;
    assert_eq!(code, Some(2), "Redis names holders by owner: {out}");
    let _ = granted.release().await;
}

/// Who holds: the record the job's acquisition left (the host, fencelock's pid, the
/// command, since when, the label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_locks_says_who_holds() {
    let cluster = ZooKeeperCluster::shared();
    let ns = "/cli-who";
    let service = vec![
        "--backend".into(),
        "zookeeper".into(),
        "--zookeeper".into(),
        cluster.connect_string(),
        "--namespace".into(),
        ns.into(),
    ];
    let before = std::time::SystemTime::now();
    let (job, _) = job(&service, "report").await;
    let pid = job.id().expect("pid");
    let (code, out) = fencelock("locks", &service, &["--json"], "").await;
    assert_eq!(code, Some(0), "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let holder = &report["locks"][0]["holders"][0]["holder"];
    assert_eq!(holder["pid"], pid, "{out}");
    assert_eq!(holder["program"], "sh", "{out}");
    assert_eq!(holder["label"], "nightly-2026-12-02", "{out}");
    assert_eq!(holder["ttl_ms"], 2000, "{out}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(holder["host"], host.trim(), "{out}");
    let since = holder["since_unix_ms"].as_u64().expect("since");
    let before_ms = before
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    assert!(u128::from(since) >= before_ms - 1_000, "{out}");
    let (code, table) = fencelock("locks", &service, &[], "").await;
    assert_eq!(code, Some(0), "{table}");
    assert!(
        table.contains(&format!(
            "on {} pid {pid} sh label nightly-2026-12-02",
            host.trim()
        )) && table.contains("holder's clock"),
        "{table}"
    );
    drop(job);
}
