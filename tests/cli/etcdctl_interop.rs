//! Go's lock and fencelock's share one queue: `etcdctl lock <ns>/<name>` (Go's
//! `concurrency.Mutex`, what etcd's Lock RPC runs too) and `fencelock run --namespace <ns>
//! --lock <name>` exclude each other, because both queue by create revision under
//! `<ns>/<name>/`.

use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::process::Command;

use crate::support::fencelock_run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_fencelock_run_never_hold_the_same_lock_at_once() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let section = |who: &str| {
        format!(
            "echo start {who} >> {log}; sleep 0.2; echo end {who} >> {log}",
            log = log.display()
        )
    };
    let mut runs = Vec::new();
    for i in 0..3 {
        let mut go = Command::new("etcdctl");
        go.env("ETCDCTL_API", "3")
            .args(["--endpoints", &etcd.endpoint(0), "lock", "interop/job"])
            .args(["--", "sh", "-c", &section(&format!("etcdctl-{i}"))])
            .kill_on_drop(true);
        runs.push(go.status());
        let mut ours = fencelock_run(&etcd.endpoints(), "interop");
        ours.args(["--lock", "job", "--"])
            .args(["sh", "-c", &section(&format!("fencelock-{i}"))]);
        runs.push(ours.status());
    }
    for run in runs {
        let status = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("finishes")
            .expect("runs (is etcdctl installed? .ci/install-deps installs it)");
        assert!(status.success(), "{status}");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{text}");
    for pair in lines.chunks(2) {
        // Each section's start is followed by its own end: never two holders at once.
        let who = pair[0].strip_prefix("start ").expect("a start");
        assert_eq!(pair[1], format!("end {who}"), "{text}");
    }
    let go = lines
        .iter()
        .filter(|l| l.starts_with("start etcdctl"))
        .count();
    assert_eq!(go, 3, "{text}");
}

/// `etcdctl lock` on single names and `fencelock run --lock a --lock b` (one transaction
/// for both keys) on the same names: every run ends (no deadlock: a single lock holds one
/// key and waits for nothing while holding), and a run holding both never overlaps an
/// `etcdctl lock` of either name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_single_locks_and_fencelock_run_on_two_locks_mix_safely() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let section = |who: &str| {
        format!(
            "echo start {who} >> {log}; sleep 0.2; echo end {who} >> {log}",
            log = log.display()
        )
    };
    let mut runs = Vec::new();
    for i in 0..2 {
        for name in ["a", "b"] {
            let mut go = Command::new("etcdctl");
            go.env("ETCDCTL_API", "3")
                .args(["--endpoints", &etcd.endpoint(0), "lock"])
                .arg(format!("interop/{name}"))
                .args(["--", "sh", "-c", &section(&format!("etcdctl-{name}-{i}"))])
                .kill_on_drop(true);
            runs.push(go.status());
        }
        let order = if i == 0 { ["a", "b"] } else { ["b", "a"] };
        let mut ours = fencelock_run(&etcd.endpoints(), "interop");
        ours.args(["--lock", order[0], "--lock", order[1], "--"])
            .args(["sh", "-c", &section(&format!("fencelock-ab-{i}"))]);
        runs.push(ours.status());
    }
    for run in runs {
        let status = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("no deadlock: every run finishes")
            .expect("runs (is etcdctl installed? .ci/install-deps installs it)");
        assert!(status.success(), "{status}");
    }
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(text.lines().count(), 12, "{text}");
    // The names each section holds: etcdctl-<name>-<i> one, fencelock-ab-<i> both.
    let holds = |who: &str| -> Vec<&'static str> {
        if who.starts_with("fencelock") {
            vec!["a", "b"]
        } else if who.starts_with("etcdctl-a") {
            vec!["a"]
        } else {
            vec!["b"]
        }
    };
    let mut running: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(who) = line.strip_prefix("start ") {
            for other in &running {
                let shared = holds(who).iter().any(|n| holds(other).contains(n));
                assert!(
                    !shared,
                    "{who} started while {other} held a name of it:\n{text}"
                );
            }
            running.push(who.to_owned());
        } else if let Some(who) = line.strip_prefix("end ") {
            running.retain(|r| r != who);
        }
    }
}
