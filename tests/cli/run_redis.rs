//! `fencelock run --backend redis|redlock`: the same rules as on etcd. One invocation at a
//! time with increasing tokens; a lock found gone stops the command (76); cut off from
//! Redis, the command is dead before anyone else can be granted the lock.

use std::process::Stdio;
use std::time::Duration;

use fencelock::redis::RedisLocker;
use fencelock::testkit::{FaultProxy, RedisServer};
use fencelock::{LockBackend, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{assert_one_at_a_time, last_sign_of_life, life_script, next_line, now_ns};

/// `fencelock run --backend <backend> <servers…> --namespace <ns>`, killed if the test
/// drops it.
pub fn fencelock_on(backend: &str, servers: &[String], ns: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command.args(["run", "--backend", backend, "--namespace", ns]);
    match backend {
        "redis" => command.args(["--redis", &servers[0]]),
        _ => command.args(["--redlock", &servers.join(",")]),
    };
    command.stderr(Stdio::null()).kill_on_drop(true);
    command
}

/// Runs `count` invocations at once, each logging `start <token>` and `end <token>`, and
/// checks that they never overlapped and that the tokens increased.
async fn one_at_a_time(backend: &str, servers: &[String]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let script = format!(
        "echo start $FENCELOCK_TOKEN >> {log}; sleep 0.2; echo end $FENCELOCK_TOKEN >> {log}",
        log = log.display()
    );
    let mut runs = Vec::new();
    for _ in 0..3 {
        let mut command = fencelock_on(backend, servers, "cli-redis");
        command.args([
            "--lock", "nightly", "--ttl", "2s", "--", "sh", "-c", &script,
        ]);
        runs.push(command.status());
    }
    for run in runs {
        let status = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("finishes")
            .expect("runs");
        assert!(status.success(), "{backend}: {status}");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    assert_one_at_a_time(&text, 3, backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_concurrent_invocations_run_one_at_a_time_with_increasing_tokens() {
    let redis = RedisServer::start().await.expect("redis");
    one_at_a_time("redis", &[redis.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_concurrent_invocations_run_one_at_a_time_with_increasing_tokens() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(RedisServer::start().await.expect("redis"));
    }
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    one_at_a_time("redlock", &urls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_command_is_stopped_when_its_key_is_gone() {
    let redis = RedisServer::start().await.expect("redis");
    let mut fencelock = fencelock_on("redis", &[redis.url()], "cli-redis-gone")
        .args(["--lock", "cron", "--ttl", "1s", "--grace", "300ms", "--"])
        .args([
            "sh",
            "-c",
            "echo key=$FENCELOCK_KEY; sleep 30; echo finished",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    let first = next_line(&mut lines).await;
    let key = first.strip_prefix("key=").expect("key line").to_owned();

    // Someone deletes the key (an operator, a failover to a replica that never saw it).
    let client = redis::Client::open(redis.admin_url()).expect("client");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let deleted: u64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1, "the command ran under {key}");

    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    assert_eq!(
        status.code(),
        Some(76),
        "exit status says the lock was lost"
    );
    let rest = lines.next_line().await.expect("read");
    assert_eq!(rest, None, "the command was stopped before it finished");
}

/// Nanoseconds on the wall clock, which the test and the command share (one machine).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cut_off_the_command_is_dead_before_the_next_grant() {
    let redis = RedisServer::start().await.expect("redis");
    let ns = "cli-redis-cut";
    let next = RedisLocker::connect(redis.config(ns))
        .await
        .expect("connect");
    let proxy = FaultProxy::start(
        format!("127.0.0.1:{}", redis.port())
            .parse()
            .expect("address"),
    )
    .await
    .expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let life = dir.path().join("life");
    let script = life_script(&life);
    let through_proxy = format!("redis://{}/", proxy.address());
    let mut fencelock = fencelock_on("redis", &[through_proxy], ns)
        .args(["--lock", "job", "--ttl", "1s", "--grace", "300ms", "--"])
        .args(["sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    proxy.cut();

    // The key expires on the server; the next client is granted the lock then.
    let granted = next
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the lock passes on");
    let grant = now_ns();
    let status = tokio::time::timeout(Duration::from_secs(20), fencelock.wait())
        .await
        .expect("fencelock exits")
        .expect("status");
    let last = last_sign_of_life(&life);
    assert!(
        last < grant,
        "the command wrote {} ms after the next grant",
        (last - grant) / 1_000_000
    );
    eprintln!(
        "last sign of life {} ms before the next grant",
        (grant - last) / 1_000_000
    );
    assert_eq!(status.code(), Some(76), "the lock was lost");
    drop(granted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_server_that_may_evict_keys_is_refused_unless_allowed() {
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"])
        .await
        .expect("redis");
    let output = fencelock_on("redis", &[redis.url()], "cli-redis-evicting")
        .args(["--lock", "job", "--", "true"])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("maxmemory-policy"), "{stderr}");
    let output = fencelock_on("redis", &[redis.url()], "cli-redis-evicting")
        .args(["--redis-allow-eviction", "--lock", "job", "--", "true"])
        .output()
        .await
        .expect("run");
    assert_eq!(output.status.code(), Some(0), "allowed by the flag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_restart_during_the_wait_does_not_end_it() {
    let mut redis = RedisServer::start().await.expect("redis");
    let ns = "cli-redis-restart";
    let holder = RedisLocker::connect(redis.config(ns))
        .await
        .expect("connect");
    let held = holder
        .lock("job", &LockOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .expect("lock");
    let waiting = fencelock_on("redis", &[redis.url()], ns)
        .args(["--lock", "job", "--wait", "30s", "--", "true"])
        .stderr(Stdio::piped())
        .output();
    let waiting = tokio::spawn(waiting);
    // Once the waiter listens for the release message, it is waiting.
    let channel = format!("{ns}:released:job");
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut conn = redis.connection().await.expect("connect");
            let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .expect("PUBSUB NUMSUB");
            if subscribers >= 1 {
                return;
            }
            // No event tells another client that a subscription landed: look every 10 ms.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiter subscribes");
    // Restarted empty: the lock is free once Redis is back.
    redis.restart().await.expect("restart");
    let output = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("fencelock exits")
        .expect("join")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "a brief Redis restart ended the wait: {stderr}"
    );
    drop(held);
}
