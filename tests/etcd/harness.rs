//! The harness itself: faults on a 3-node cluster, and a failing start that says why.

use std::os::unix::fs::PermissionsExt;

use fencelock::testkit::{EtcdCluster, TestkitError};

#[tokio::test]
async fn members_can_be_paused_resumed_killed_and_restarted() {
    let mut cluster = EtcdCluster::builder()
        .members(3)
        .start()
        .await
        .expect("cluster");
    let leader = cluster.leader().await.expect("leader");
    let follower = (leader + 1) % cluster.len();
    // Talk to the leader only: a client balanced over all members would send some
    // requests to the member this test kills.
    let mut client = etcd_client::Client::connect([cluster.endpoint(leader)], None)
        .await
        .expect("client");

    // A paused follower: the majority still commits writes.
    cluster.pause(follower).expect("pause");
    client.put("k", "while-paused", None).await.expect("put");
    cluster.resume(follower).expect("resume");

    // A killed member comes back with its data and serves reads of later writes.
    let pid = cluster.pid(follower).expect("running");
    cluster.kill(follower).expect("kill");
    assert_eq!(cluster.pid(follower), None);
    client.put("k", "while-dead", None).await.expect("put");
    cluster.restart(follower).await.expect("restart");
    assert_ne!(cluster.pid(follower), Some(pid));
    let mut direct = etcd_client::Client::connect([cluster.endpoint(follower)], None)
        .await
        .expect("connect");
    let value = direct.get("k", None).await.expect("get");
    assert_eq!(value.kvs()[0].value(), b"while-dead");
}

#[tokio::test]
async fn a_failing_start_reports_the_servers_last_words() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = dir.path().join("etcd");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'fake etcd: cannot start' >&2\nexit 3\n",
    )
    .expect("write");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let err = EtcdCluster::builder()
        .binary(&fake)
        .start()
        .await
        .expect_err("must fail");
    assert!(matches!(err, TestkitError::NotReady { .. }), "{err}");
    assert!(err.to_string().contains("fake etcd: cannot start"), "{err}");
}

/// The suite runs against the etcd it was asked to run: CI sets
/// `FENCELOCK_EXPECT_ETCD_VERSION` (e.g. `3.5`) beside `FENCELOCK_ETCD_BIN`, so that a
/// binary that silently fell back to `PATH`'s etcd fails here instead of passing as 3.5.
#[tokio::test]
async fn the_server_runs_the_expected_etcd_version() {
    let cluster = EtcdCluster::single().await.expect("etcd");
    let mut client = cluster.client().await.expect("client");
    let version = client.status().await.expect("status").version().to_owned();
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "etcd reported version {version:?}"
    );
    if let Ok(expected) = std::env::var("FENCELOCK_EXPECT_ETCD_VERSION") {
        assert!(
            version == expected || version.starts_with(&format!("{expected}.")),
            "expected etcd {expected}, the server reports {version}"
        );
    }
}
