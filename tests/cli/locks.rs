//! `fencelock locks`: a held lock and its waiter, as JSON and as a table; an invalid name
//! is a usage error before any connection.

use std::time::Duration;

use fencelock::etcd::{EtcdLocker, lock_prefix};
use fencelock::testkit::EtcdCluster;
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::process::Command;

async fn fencelock_locks(etcd: &EtcdCluster, namespace: &str, extra: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "locks",
            "--etcd",
            &etcd.endpoints().join(","),
            "--namespace",
            namespace,
        ])
        .args(extra)
        .output()
        .await
        .expect("fencelock locks");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_shows_the_holder_and_its_waiter() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-locks";
    let holder = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let waiter = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let mut admin = etcd.client().await.expect("client");
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    let labelled = options.clone().with_holder_label("nightly 2026-12-03");
    let held = holder.lock("payments", &labelled).await.expect("lock");
    // The waiter's key is in the queue once a second key exists under the prefix. It
    // records nothing of itself.
    let queued = tokio::spawn({
        let options = options.clone().with_holder_info(false);
        async move { waiter.lock("payments", &options).await }
    });
    let prefix = lock_prefix(ns, "payments");
    let mut watch = admin
        .watch(
            prefix.as_str(),
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1),
            ),
        )
        .await
        .expect("watch");
    let mut puts = 0;
    while puts < 2 {
        let response = watch.message().await.expect("watch").expect("open");
        puts += response
            .events()
            .iter()
            .filter(|e| e.event_type() == etcd_client::EventType::Put)
            .count();
    }

    let (code, out) = fencelock_locks(&etcd, ns, &["--json"]).await;
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let locks = report["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 1, "{out}");
    assert_eq!(locks[0]["name"], "payments");
    let holders = locks[0]["holders"].as_array().expect("holders");
    let waiters = locks[0]["waiters"].as_array().expect("waiters");
    assert_eq!(holders.len(), 1, "{out}");
    assert_eq!(waiters.len(), 1, "{out}");
    assert_eq!(holders[0]["key"], held.key());
    assert_eq!(holders[0]["token"], held.token().get());
    assert_eq!(holders[0]["lease_id"], held.lease_id());
    assert_eq!(holders[0]["role"], "lock");
    assert_eq!(holders[0]["lease_ttl_s"], 10);
    assert!(waiters[0]["token"].as_u64() > holders[0]["token"].as_u64());
    // Who holds, as the holder recorded itself in its key's value.
    let who = &holders[0]["holder"];
    assert_eq!(who["pid"], std::process::id(), "{out}");
    assert_eq!(who["label"], "nightly 2026-12-03", "{out}");
    assert_eq!(who["ttl_ms"], 10_000, "{out}");
    assert!(who["host"].as_str().is_some_and(|h| !h.is_empty()), "{out}");
    assert!(who["program"].as_str().is_some(), "{out}");
    assert!(waiters[0]["holder"].is_null(), "{out}");

    let (code, table) = fencelock_locks(&etcd, ns, &["--lock", "payments"]).await;
    assert_eq!(code, 0, "{table}");
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("payments"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("holds") && rows[0].contains(held.key()),
        "{table}"
    );
    assert!(
        table.contains(&format!("pid {}", std::process::id())) && table.contains("nightly"),
        "{table}"
    );
    assert!(rows[1].contains("waits #1"), "{table}");

    drop(held);
    let next = tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("the waiter gets the lock")
        .expect("task")
        .expect("lock");
    drop(next);
}

#[tokio::test]
async fn an_invalid_name_is_a_usage_error() {
    // No server: the name is checked before connecting.
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["locks", "--etcd", "http://127.0.0.1:1", "--lock", "a/b"])
        .output()
        .await
        .expect("fencelock locks");
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test]
async fn locks_on_redis_shows_the_holder_and_says_waiters_are_not_visible() {
    let server = fencelock::testkit::RedisServer::start()
        .await
        .expect("redis-server");
    let locks = fencelock::redis::RedisLocker::connect(server.config("cli-locks"))
        .await
        .expect("connect");
    let held = locks
        .lock(
            "payments",
            &LockOptions::new().with_holder_label("nightly 2026-12-03"),
        )
        .await
        .expect("lock");
    let unrecorded = locks
        .lock("refunds", &LockOptions::new().with_holder_info(false))
        .await
        .expect("lock");
    let run = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
        command.args(["locks", "--backend", "redis", "--redis", &server.url()]);
        command.args(["--namespace", "cli-locks"]);
        if json {
            command.arg("--json");
        }
        command.output()
    };
    let output = run(true).await.expect("fencelock locks");
    assert_eq!(output.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["waiters_visible"], false);
    let holder = &report["locks"][0]["holders"][0];
    assert_eq!(report["locks"][0]["name"], "payments");
    assert_eq!(holder["owner"], held.owner());
    assert_eq!(holder["key"], held.key());
    assert!(report["locks"][0]["last_token"].as_u64() >= Some(held.token().get()));
    // Who holds, as the holder recorded itself after its owner value.
    assert_recorded(&holder["holder"], 10_000, &report);
    assert_eq!(report["locks"][1]["name"], "refunds");
    let bare = &report["locks"][1]["holders"][0];
    assert_eq!(bare["owner"], unrecorded.owner());
    assert!(bare["holder"].is_null(), "{report}");

    let output = run(false).await.expect("fencelock locks");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains(held.owner()), "{table}");
    assert!(table.contains("waiters are not visible"), "{table}");
    assert_eq!(
        table
            .matches(&format!("pid {}", std::process::id()))
            .count(),
        1,
        "the recorded holder only: {table}"
    );
    assert!(table.contains("label nightly 2026-12-03"), "{table}");
    drop((held, unrecorded));
}

/// `who` is the test process's holder record: its pid, host, program, the label
/// `nightly 2026-12-03`, `ttl_ms` and a `since` by this clock.
fn assert_recorded(who: &serde_json::Value, ttl_ms: u64, report: &serde_json::Value) {
    assert_eq!(who["pid"], std::process::id(), "{report}");
    assert_eq!(who["label"], "nightly 2026-12-03", "{report}");
    assert_eq!(who["ttl_ms"], ttl_ms, "{report}");
    assert!(
        who["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{report}"
    );
    let program = std::env::args_os()
        .next()
        .and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .expect("this test's program");
    assert_eq!(who["program"], program.as_str(), "{report}");
    let since = who["since_unix_ms"].as_u64().expect("since_unix_ms");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    assert!(
        u128::from(since) <= now && now - u128::from(since) < 60_000,
        "{report}"
    );
    assert!(
        who["since"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{report}"
    );
}

#[tokio::test]
async fn locks_on_redlock_shows_each_holder_with_its_masters() {
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(
            fencelock::testkit::RedisServer::start()
                .await
                .expect("redis-server"),
        );
    }
    let urls: Vec<String> = masters.iter().map(|m| m.url()).collect();
    let config = fencelock::redis::RedisConfig::masters(urls.clone()).with_prefix("cli-redlock");
    let locks = fencelock::redis::RedlockLocker::connect(config)
        .await
        .expect("connect");
    let options = LockOptions::new().with_ttl(Duration::from_secs(20));
    let held = locks
        .lock(
            "payments",
            &options.clone().with_holder_label("nightly 2026-12-03"),
        )
        .await
        .expect("lock");
    let unrecorded = locks
        .lock("refunds", &options.with_holder_info(false))
        .await
        .expect("lock");
    let run = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
        command.args([
            "locks",
            "--backend",
            "redlock",
            "--redlock",
            &urls.join(","),
        ]);
        command.args(["--namespace", "cli-redlock"]);
        command.args(extra);
        command.output()
    };
    let output = run(&["--json"]).await.expect("fencelock locks");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["backend"], "redlock");
    assert_eq!(report["quorum"], 2);
    assert_eq!(report["locks"][0]["name"], "payments", "{report}");
    let holder = &report["locks"][0]["holders"][0];
    assert_eq!(holder["owner"], held.owner());
    assert_eq!(holder["quorum"], true);
    assert_eq!(
        holder["masters"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
    assert_recorded(&holder["holder"], 20_000, &report);
    assert_eq!(report["locks"][1]["name"], "refunds", "{report}");
    let bare = &report["locks"][1]["holders"][0];
    assert_eq!(bare["owner"], unrecorded.owner());
    assert!(bare["holder"].is_null(), "{report}");

    let output = run(&["--lock", "payments"]).await.expect("fencelock locks");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("payments"))
        .expect("a row");
    assert!(
        row.contains("holds") && row.contains(held.owner()),
        "{table}"
    );
    assert!(
        table.contains(&format!("pid {}", std::process::id()))
            && table.contains("label nightly 2026-12-03"),
        "{table}"
    );
    assert!(!table.contains("refunds"), "{table}");
    drop((held, unrecorded));
}
