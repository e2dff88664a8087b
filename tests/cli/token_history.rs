//! The token's precondition: a lock service whose history never goes back. A ZooKeeper
//! data dir restored from an older copy does go back: its zxids start again below tokens
//! storage has already seen, so the fence refuses every new holder's writes, and
//! `fencelock locks --newest-token` says why. On etcd the same check runs against the
//! store's current revision.

use std::process::Stdio;
use std::time::Duration;

use fencelock::etcd::EtcdLocker;
use fencelock::postgres::{Fence, FenceError};
use fencelock::testkit::{EtcdCluster, PostgresServer, ZooKeeperCluster};
use fencelock::zookeeper::ZooKeeperLocker;
use fencelock::{FencingToken, LockBackend, LockGuard, LockOptions, ReleaseOutcome};
use tokio::process::Command;

/// `fencelock locks ... --newest-token <newest>`: its exit status and stderr.
async fn check(args: &[&str], newest: u64) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("locks")
        .args(args)
        .args(["--newest-token", &newest.to_string()])
        .stdout(Stdio::null())
        .output()
        .await
        .expect("fencelock locks");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Takes and gives back lock `job` `times` times; returns the last grant's token.
async fn grants(cluster: &ZooKeeperCluster, ns: &str, times: usize) -> FencingToken {
    let locks = ZooKeeperLocker::connect(cluster.config(ns))
        .await
        .expect("connect");
    let mut token = None;
    for _ in 0..times {
        let guard = locks.lock("job", &LockOptions::new()).await.expect("lock");
        token = Some(guard.token());
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    token.expect("at least one grant")
}

async fn fenced_write(
    db: &mut tokio_postgres::Client,
    token: FencingToken,
) -> Result<(), FenceError> {
    Fence::new().begin(db, "job", token).await?.commit().await
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_restored_from_an_older_copy_reissues_old_tokens_and_the_check_says_so() {
    let mut zookeeper = ZooKeeperCluster::single().await.expect("zookeeper");
    let postgres = PostgresServer::start().await.expect("postgres");
    let database = postgres.create_database().await.expect("database");
    let mut db = postgres.connect(&database).await.expect("connect");
    Fence::new().ensure_schema(&db).await.expect("fence schema");
    let ns = "/restored";
    grants(&zookeeper, ns, 1).await;

    // The operator's backup: a copy of the data dir.
    let backup = tempfile::tempdir().expect("tempdir");
    let copy = backup.path().join("data");
    zookeeper.kill(0).expect("stop");
    copy_dir(&zookeeper.data_dir(0), &copy);
    zookeeper.restart(0).await.expect("restart");

    // Life goes on: grants, and a write that storage accepts with the newest token.
    let newest = grants(&zookeeper, ns, 10).await;
    fenced_write(&mut db, newest)
        .await
        .expect("the newest holder writes");
    let hosts = zookeeper.connect_string();
    let args = [
        "--backend",
        "zookeeper",
        "--zookeeper",
        &hosts,
        "--namespace",
        ns,
    ];
    assert_eq!(
        check(&args, newest.get()).await.0,
        Some(0),
        "history intact"
    );

    // The data dir is restored from the copy.
    zookeeper.kill(0).expect("stop");
    std::fs::remove_dir_all(zookeeper.data_dir(0)).expect("remove the data dir");
    copy_dir(&copy, &zookeeper.data_dir(0));
    zookeeper.restart(0).await.expect("restart");

    let reissued = grants(&zookeeper, ns, 1).await;
    assert!(
        reissued < newest,
        "the restored server hands out older tokens: {reissued} after {newest}"
    );
    let refused = fenced_write(&mut db, reissued)
        .await
        .expect_err("a token storage has seen is refused");
    assert!(
        matches!(refused, FenceError::Stale { presented, current, .. }
            if presented == reissued && current == newest),
        "{refused}"
    );
    let (code, stderr) = check(&args, newest.get()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("history is behind") && stderr.contains(&newest.get().to_string()),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_compares_a_token_with_etcds_current_revision() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "history";
    let locks = EtcdLocker::connect(etcd.config(ns)).await.expect("connect");
    let guard = locks
        .lock("job", &LockOptions::new().with_ttl(Duration::from_secs(10)))
        .await
        .expect("lock");
    let token = guard.token().get();
    let endpoints = etcd.endpoints().join(",");
    let args = ["--etcd", &endpoints, "--namespace", ns];
    assert_eq!(
        check(&args, token).await.0,
        Some(0),
        "a token it handed out"
    );
    let (code, stderr) = check(&args, token + 1_000).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("etcd's current revision is"), "{stderr}");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}
