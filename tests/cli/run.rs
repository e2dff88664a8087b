//! `fencelock run`: one invocation at a time, with increasing tokens; the command is
//! terminated when its lease is revoked.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{assert_one_at_a_time, run_in_opposite_orders};

fn fencelock(etcd: &EtcdCluster) -> Command {
    crate::support::fencelock_run(&etcd.endpoints(), "cli-test")
}

/// Starts `count` invocations of `fencelock run <args> -- sh -c <script>` at once, where
/// the script may append to `{log}`; waits for all, checks they succeeded, returns the log.
async fn run_concurrently(etcd: &EtcdCluster, count: usize, args: &[&str], script: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let script = script.replace("{log}", &log.display().to_string());
    let mut runs = Vec::new();
    for _ in 0..count {
        let mut command = fencelock(etcd);
        command.args(args).args(["--", "sh", "-c", &script]);
        runs.push(command.status());
    }
    for run in runs {
        let status = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("finishes")
            .expect("runs");
        assert!(status.success(), "{status}");
    }
    std::fs::read_to_string(&log).expect("log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_invocations_run_one_at_a_time_with_increasing_tokens() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let script =
        "echo start $FENCELOCK_TOKEN >> {log}; sleep 0.2; echo end $FENCELOCK_TOKEN >> {log}";
    let text = run_concurrently(&etcd, 3, &["--lock", "nightly"], script).await;
    assert_one_at_a_time(&text, 3, "etcd");
}

/// `--lock a --lock b` on etcd: both taken together in one transaction (whatever order
/// given), one run at a time, each name's token (the transaction's revision, the same for
/// both) in FENCELOCK_TOKENS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_locks_are_held_together_whatever_their_order() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let tokens = dir.path().join("tokens");
    let script = format!(
        "echo start $FENCELOCK_TOKEN >> {log}; echo \"$FENCELOCK_LOCK $FENCELOCK_TOKENS\" \
         >> {tokens}; sleep 0.2; echo end $FENCELOCK_TOKEN >> {log}",
        log = log.display(),
        tokens = tokens.display()
    );
    run_in_opposite_orders(|order| {
        let mut command = fencelock(&etcd);
        command
            .args(["--lock", order[0], "--lock", order[1], "--"])
            .args(["sh", "-c", &script]);
        command
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("log");
    assert_one_at_a_time(&text, 4, "etcd, two locks");
    let tokens = std::fs::read_to_string(&tokens).expect("tokens");
    let mut shared = Vec::new();
    for line in tokens.lines() {
        let (names, each) = line.split_once(' ').expect("two fields");
        assert!(names == "a,b" || names == "b,a", "{line}");
        let each: Vec<&str> = each.split(',').collect();
        assert_eq!(each.len(), 2, "{line}");
        let token = |name: &str| -> u64 {
            each.iter()
                .find_map(|e| e.strip_prefix(&format!("{name}=")))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("{name}'s token in {line}"))
        };
        // Taken in one transaction: both keys have its revision as their token.
        assert_eq!(token("a"), token("b"), "{line}");
        shared.push(token("a"));
    }
    assert_eq!(shared.len(), 4);
    shared.sort_unstable();
    shared.dedup();
    assert_eq!(shared.len(), 4, "each run its own token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_is_terminated_when_the_lease_is_revoked() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut command = fencelock(&etcd);
    command
        .args(["--lock", "cron", "--ttl", "2s", "--grace", "1s", "--"])
        .args([
            "sh",
            "-c",
            "echo key=$FENCELOCK_KEY; sleep 30; echo finished",
        ])
        .stdout(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("command started")
        .expect("read")
        .expect("a line");
    let key = first.strip_prefix("key=").expect("key line").to_owned();

    let mut client = etcd.client().await.expect("client");
    let lease = client.get(key.as_str(), None).await.expect("get").kvs()[0].lease();
    client.lease_revoke(lease).await.expect("revoke");

    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
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
async fn with_permits_at_most_n_commands_run_at_once() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let script = "echo start >> {log}; sleep 0.3; echo end >> {log}";
    let args = ["--lock", "batch", "--permits", "2"];
    let text = run_concurrently(&etcd, 4, &args, script).await;
    let (mut inside, mut most) = (0i32, 0i32);
    for line in text.lines() {
        inside += if line == "start" { 1 } else { -1 };
        most = most.max(inside);
    }
    assert_eq!(text.lines().count(), 8, "{text}");
    assert_eq!(most, 2, "at most two at once, and two did overlap: {text}");
}
