//! `fencelock run` whose lock key is deleted under its live lease (an operator's `etcdctl
//! del`, a late request of another client): the next waiter may hold the lock now, so the
//! command is killed and the exit status says the lock was lost (76).

use std::process::Stdio;
use std::time::Duration;

use fencelock::testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{fencelock_run, gone_within, next_line};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_key_kills_the_command_and_exits_76() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let ns = "cli-key-deleted";
    let mut fencelock = fencelock_run(&etcd.endpoints(), ns)
        .args(["--lock", "job", "--ttl", "10s", "--"])
        .args(["sh", "-c", "echo $$; sleep 60"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(fencelock.stdout.take().expect("stdout")).lines();
    let pid: i32 = next_line(&mut lines)
        .await
        .parse()
        .expect("the command's pid");

    // The operator deletes the lock's key; the lease lives on.
    let mut client = etcd.client().await.expect("client");
    let prefix = fencelock::etcd::lock_prefix(ns, "job");
    let deleted = client
        .delete(
            prefix.as_str(),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete")
        .deleted();
    assert_eq!(deleted, 1, "the lock's one key");

    let status = tokio::time::timeout(Duration::from_secs(10), fencelock.wait())
        .await
        .expect("fencelock exits well before the lease would run out")
        .expect("status");
    assert_eq!(status.code(), Some(76), "the lock was lost");
    assert!(
        gone_within(&[pid], Duration::from_secs(2)).await.is_some(),
        "the command is dead"
    );
}
