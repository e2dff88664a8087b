//! `fencelock run` never starts its command on a lease that is over or about to be: a
//! grant whose answer came late (here every round trip to Redis takes longer than the
//! TTL leaves for the command's grace) is given back, and `--wait` runs out with 75.
//! Before issue 21 the command was forked first and killed a moment later.

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::{FaultProxy, RedisServer};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_leaves_less_than_the_grace_never_starts_the_command() {
    let redis = RedisServer::start().await.expect("redis");
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", redis.port()).parse().expect("addr"))
        .await
        .expect("proxy");
    // A round trip of 120 ms against a TTL of 200 ms: every grant arrives with about
    // 75 ms of its lease left, less than grace (50 ms) + kill margin (22 ms) + what
    // starting takes (50 ms).
    proxy.delay(Duration::from_millis(60));
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = dir.path().join("ran");
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["run", "--backend", "redis", "--namespace", "cli-late-grant"])
        .args(["--redis", &format!("redis://{}/", proxy.address())])
        .args(["--lock", "job", "--ttl", "200ms", "--wait", "1500ms", "--"])
        // Ignores SIGTERM: once started, it leaves its mark unless SIGKILL comes first.
        .args([
            "sh",
            "-c",
            &format!("trap '' TERM; echo ran > {}", ran.display()),
        ])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("fencelock exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !ran.exists(),
        "the command started on a lease with less than its grace left: {stderr}"
    );
    assert_eq!(output.status.code(), Some(75), "{stderr}");
}
