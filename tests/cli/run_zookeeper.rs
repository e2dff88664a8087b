//! `fencelock run --backend zookeeper` and `fencelock locks --backend zookeeper`: one
//! invocation at a time with increasing czxid tokens; a node deleted under the command
//! stops it (76); cut off from ZooKeeper, the command is dead before anyone else is
//! granted the lock; `locks` shows the holder and its waiter in queue order.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::{FaultProxy, ZooKeeperCluster};
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{LockBackend, LockGuard, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{
    assert_one_at_a_time, last_sign_of_life, life_script, next_line, now_ns, run_in_opposite_orders,
};

/// The standalone server these tests share (none of them breaks it).
fn zookeeper() -> &'static ZooKeeperCluster {
    ZooKeeperCluster::shared()
}

/// `fencelock <subcommand> --backend zookeeper --zookeeper <hosts> --namespace <ns>`.
pub fn fencelock_on(subcommand: &str, hosts: &str, ns: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command.args([
        subcommand,
        "--backend",
        "zookeeper",
        "--zookeeper",
        hosts,
        "--namespace",
        ns,
    ]);
    command.stderr(Stdio::null()).kill_on_drop(true);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_concurrent_invocations_run_one_at_a_time_with_increasing_tokens() {
    let hosts = zookeeper().connect_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let script = format!(
        "echo start $FENCELOCK_TOKEN >> {log}; sleep 0.2; echo end $FENCELOCK_TOKEN >> {log}",
        log = log.display()
    );
    let mut runs = Vec::new();
    for _ in 0..3 {
        let mut command = fencelock_on("run", &hosts, "cli-zk");
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
        assert!(status.success(), "{status}");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    assert_one_at_a_time(&text, 3, "zookeeper");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_the_command_is_stopped_when_its_node_is_gone() {
    let cluster = zookeeper();
    let mut fencelock = fencelock_on("run", &cluster.connect_string(), "cli-zk-gone")
        .args(["--lock", "cron", "--ttl", "2s", "--grace", "300ms", "--"])
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
    let node = first.strip_prefix("key=").expect("key line").to_owned();
    assert!(node.starts_with("/cli-zk-gone/cron/_c_"), "{node}");

    // An operator deletes the holder's node.
    let admin = cluster.client().await.expect("admin");
    admin.delete(&node, None).await.expect("delete the node");

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_cut_off_the_command_is_dead_before_the_next_grant() {
    let cluster = zookeeper();
    let ns = "cli-zk-cut";
    let next = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let proxy = FaultProxy::start(cluster.address(0).parse().expect("address"))
        .await
        .expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let life = dir.path().join("life");
    let script = life_script(&life);
    let mut fencelock = fencelock_on("run", &proxy.address().to_string(), ns)
        .args(["--lock", "job", "--ttl", "2s", "--grace", "300ms", "--"])
        .args(["sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    assert_eq!(next_line(&mut lines).await, "running");
    proxy.cut();

    // The server expires the session; the next client is granted the lock then.
    let granted = next
        .lock(
            "job",
            &LockOptions::new().with_wait_timeout(Duration::from_secs(15)),
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
    assert_eq!(status.code(), Some(76), "the lock was lost");
    drop(granted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_zookeeper_shows_the_holder_and_its_waiter() {
    let cluster = zookeeper();
    let ns = "cli-zk-locks";
    let holder = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let waiter = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let held = holder
        .lock("payments", &LockOptions::new())
        .await
        .expect("lock");
    let queued = tokio::spawn(async move { waiter.lock("payments", &LockOptions::new()).await });
    // Wait (by a child watch) until the waiter's node is in the queue.
    let admin = cluster.client().await.expect("admin");
    loop {
        let (children, _, watcher) = admin
            .get_and_watch_children(&format!("/{ns}/payments"))
            .await
            .expect("watch");
        if children.len() == 2 {
            break;
        }
        tokio::time::timeout(Duration::from_secs(10), watcher.changed())
            .await
            .expect("the waiter joins");
    }

    let output = fencelock_on("locks", &cluster.connect_string(), ns)
        .arg("--json")
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("fencelock locks");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let locks = report["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 1, "{out}");
    assert_eq!(locks[0]["name"], "payments");
    let holders = locks[0]["holders"].as_array().expect("holders");
    let waiters = locks[0]["waiters"].as_array().expect("waiters");
    assert_eq!(holders.len(), 1, "{out}");
    assert_eq!(waiters.len(), 1, "{out}");
    assert_eq!(holders[0]["path"], held.path());
    assert_eq!(holders[0]["token"], held.token().get());
    assert!(
        waiters[0]["token"].as_u64() > Some(held.token().get()),
        "the waiter's czxid is later: {out}"
    );

    let table = fencelock_on("locks", &cluster.connect_string(), ns)
        .output()
        .await
        .expect("fencelock locks");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("holds") && text.contains("waits #1"),
        "{text}"
    );

    let _ = held.release().await;
    let next = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter is granted")
        .expect("task")
        .expect("lock");
    let _ = next.release().await;
}

/// A server that grants at most 4 s, as a default one (`tickTime=2000`) grants at most
/// 40 s: the scale of the two runs below, ten times shorter.
async fn capped_server() -> ZooKeeperCluster {
    ZooKeeperCluster::single_with_max_session_timeout(Duration::from_secs(4))
        .await
        .expect("a capped zookeeper")
}

/// `--ttl 1h` on a server that grants 4 s: the command runs, timed by the granted
/// session (it used to be given back at every grant as "answered late": the start
/// check asked for what a one-hour lease would need), with a warning that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_a_ttl_above_the_servers_cap_runs_timed_by_the_granted_session() {
    let cluster = capped_server().await;
    let output = fencelock_on("run", &cluster.connect_string(), "cli-zk-capped")
        .args([
            "--lock", "hourly", "--ttl", "1h", "--wait", "5s", "--", "echo", "ran",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("fencelock run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ran\n");
    assert!(
        stderr.contains("granted a session timeout of 4s, not --ttl 3600s"),
        "{stderr}"
    );
}

/// `--grace` is sized by the granted session too. A healthy lock's time left swings
/// down to half the session timeout on ZooKeeper: a grace of 2.5 s with a 4 s session
/// used to SIGTERM the command a second into its run (143), with every heartbeat
/// answered. Now it is refused before the lock is taken (its ceiling is a third of the
/// timeout), and the default grace runs the same command to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_the_grace_is_sized_by_the_granted_session() {
    let cluster = capped_server().await;
    let run = |grace: Option<&str>| {
        let mut command = fencelock_on("run", &cluster.connect_string(), "cli-zk-grace");
        command.args(["--lock", "job", "--ttl", "6s"]);
        if let Some(grace) = grace {
            command.args(["--grace", grace]);
        }
        command
            .args(["--", "sh", "-c", "sleep 3; echo finished"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
    };
    let refused = run(Some("2500ms")).await.expect("fencelock run");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--grace 2.5s is more than a third of the granted session timeout 4s"),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&refused.stdout),
        "",
        "never started"
    );

    let healthy = run(None).await.expect("fencelock run");
    let stderr = String::from_utf8_lossy(&healthy.stderr);
    assert_eq!(healthy.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&healthy.stdout), "finished\n");
    assert!(!stderr.contains("SIGTERM"), "{stderr}");
}

/// A kazoo client's node on the same path is a contender like any other: `locks` shows it
/// holding, with its kind, and our waiter behind it (it used to be left out of the
/// report, as it was left out of the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_zookeeper_shows_a_kazoo_holder_with_its_kind() {
    let cluster = zookeeper();
    let ns = "cli-zk-kazoo";
    let mut kazoo = fencelock::testkit::LockPeer::kazoo(&cluster.connect_string())
        .await
        .expect("kazoo");
    let answer = Duration::from_secs(30);
    assert_eq!(
        kazoo
            .ask(&format!("hold lock /{ns}/job"), answer)
            .await
            .expect("hold"),
        "held"
    );
    let waiter = ZooKeeperLocker::connect(cluster.config(&format!("/{ns}")))
        .await
        .expect("connect");
    let queued = tokio::spawn(async move { waiter.lock("job", &LockOptions::new()).await });
    let admin = cluster.client().await.expect("admin");
    loop {
        let (children, _, watcher) = admin
            .get_and_watch_children(&format!("/{ns}/job"))
            .await
            .expect("watch");
        if children.len() == 2 {
            break;
        }
        tokio::time::timeout(Duration::from_secs(10), watcher.changed())
            .await
            .expect("our waiter joins");
    }
    let output = fencelock_on("locks", &cluster.connect_string(), &format!("/{ns}"))
        .args(["--lock", "job", "--json"])
        .output()
        .await
        .expect("fencelock locks");
    let out = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let holders = report["locks"][0]["holders"].as_array().expect("holders");
    let waiters = report["locks"][0]["waiters"].as_array().expect("waiters");
    assert_eq!((holders.len(), waiters.len()), (1, 1), "{out}");
    assert_eq!(holders[0]["kind"], "kazoo-lock", "{out}");
    assert!(
        holders[0]["path"]
            .as_str()
            .is_some_and(|path| path.contains("__lock__")),
        "{out}"
    );
    assert_eq!(waiters[0]["kind"], "lock", "{out}");
    kazoo.ask("release", answer).await.expect("release");
    let granted = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("our waiter is granted once kazoo releases")
        .expect("task")
        .expect("lock");
    let _ = granted.release().await;
}

/// A path another client's semaphore uses is reported as refused, not as a failure of the
/// whole report: the other locks of the namespace are listed, and `--newest-token` still
/// checks (the report used to fail with 70 at the first such path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_zookeeper_lists_a_semaphore_path_as_refused() {
    let cluster = zookeeper();
    let ns = "/cli-zk-semaphore";
    let mut curator = fencelock::testkit::LockPeer::curator(&cluster.connect_string())
        .await
        .expect("curator");
    let answer = Duration::from_secs(30);
    assert_eq!(
        curator
            .ask(&format!("hold semaphore {ns}/sem"), answer)
            .await
            .expect("hold"),
        "held"
    );
    let locks = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let held = locks.lock("job", &LockOptions::new()).await.expect("lock");
    let refused = locks
        .try_lock("sem", &LockOptions::new())
        .await
        .expect_err("the semaphore's path is refused");
    assert!(refused.is_incompatible_recipe(), "{refused}");
    let output = fencelock_on("locks", &cluster.connect_string(), ns)
        .args(["--json", "--newest-token", "1"])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("fencelock locks");
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let by_name = |name: &str| {
        report["locks"]
            .as_array()
            .and_then(|locks| locks.iter().find(|lock| lock["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {out}"))
    };
    assert_eq!(by_name("job")["holders"][0]["token"], held.token().get());
    assert!(
        by_name("sem")["incompatible"]
            .as_str()
            .is_some_and(|recipe| recipe.contains("InterProcessSemaphoreV2")),
        "{out}"
    );
    let _ = held.release().await;
    curator.ask("release", answer).await.expect("release");
}

/// `run --lock a --lock b` on ZooKeeper holds both together: while the command runs,
/// neither can be taken elsewhere; it gets the shared token and each name's; opposite
/// orders from two runs never deadlock. With --permits, several --lock are a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper_several_locks_are_held_together() {
    let hosts = zookeeper().connect_string();
    let ns = "cli-zk-several";
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let sections = dir.path().join("sections");
    let script = format!(
        "echo start $FENCELOCK_TOKEN >> {sections}; \
         echo \"$FENCELOCK_LOCK $FENCELOCK_TOKEN $FENCELOCK_TOKENS\" >> {log}; sleep 0.3; \
         echo end $FENCELOCK_TOKEN >> {sections}",
        log = log.display(),
        sections = sections.display()
    );
    // Two runs in opposite orders, twice each, at once.
    run_in_opposite_orders(|order| {
        let mut command = fencelock_on("run", &hosts, ns);
        command.args([
            "--lock", order[0], "--lock", order[1], "--ttl", "4s", "--", "sh", "-c", &script,
        ]);
        command
    })
    .await;
    let locks = ZooKeeperLocker::connect(zookeeper().config(ns))
        .await
        .expect("connect");
    let lines = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let mut tokens = Vec::new();
    for line in &lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        let token = fields[1];
        assert!(
            fields[0] == "a,b" || fields[0] == "b,a",
            "FENCELOCK_LOCK names both: {line}"
        );
        let mut each: Vec<&str> = fields[2].split(',').collect();
        each.sort_unstable();
        assert_eq!(each, [format!("a={token}"), format!("b={token}")], "{line}");
        tokens.push(token.parse::<u64>().expect("a token"));
    }
    // One grant after another: never two at once, tokens strictly increasing.
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let sections = std::fs::read_to_string(&sections).expect("sections");
    crate::support::assert_one_at_a_time(&sections, 4, "run --lock a --lock b");
    // Nothing left behind: both locks are free.
    for name in ["a", "b"] {
        let guard = locks
            .try_lock(name, &LockOptions::new())
            .await
            .expect("try")
            .unwrap_or_else(|| panic!("{name} left held"));
        drop(guard);
    }

    // Several --lock with --permits: a usage error (2), before connecting anywhere.
    let status = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "run",
            "--etcd",
            "http://127.0.0.1:9",
            "--permits",
            "2",
            "--lock",
            "a",
            "--lock",
            "b",
            "--",
            "true",
        ])
        .stderr(Stdio::null())
        .status()
        .await
        .expect("runs");
    assert_eq!(status.code(), Some(2));
}
