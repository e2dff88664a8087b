//! `fencelock run` against a mutual-TLS etcd started the documented way, with etcdctl's
//! flags, and under a user scoped to its namespace, the password from the environment.

use std::process::Stdio;

use fencelock::testkit::{EtcdCluster, TestPki};
use tokio::process::Command;

fn fencelock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command.arg("run").kill_on_drop(true);
    for variable in [
        "FENCELOCK_ETCD",
        "FENCELOCK_ETCD_CACERT",
        "FENCELOCK_ETCD_CERT",
        "FENCELOCK_ETCD_KEY",
        "FENCELOCK_ETCD_USER",
        "FENCELOCK_ETCD_PASSWORD",
    ] {
        command.env_remove(variable);
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_works_against_a_mutual_tls_etcd_with_etcdctls_flags() {
    let pki = TestPki::generate().expect("pki");
    let etcd = EtcdCluster::builder()
        .tls(
            pki.server_tls(true),
            pki.client_tls("root").expect("client"),
        )
        .start()
        .await
        .expect("mTLS etcd");
    let client = pki.client("locker").expect("client cert");
    let output = fencelock()
        .args(["--etcd", &etcd.endpoint(0), "--lock", "x"])
        .arg("--cacert")
        .arg(pki.ca_cert())
        .arg("--cert")
        .arg(&client.cert)
        .arg("--key")
        .arg(&client.key)
        .args(["--", "sh", "-c", "echo token=$FENCELOCK_TOKEN"])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("token="), "{stdout}");

    // The same without a client certificate: refused, and it says why.
    let output = fencelock()
        .args(["--etcd", &etcd.endpoint(0), "--lock", "x"])
        .arg("--cacert")
        .arg(pki.ca_cert())
        .args(["--", "true"])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("client certificate"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_works_as_a_user_scoped_to_its_namespace() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let mut admin = etcd.client().await.expect("admin");
    admin.role_add("jobs-locker").await.expect("role");
    admin
        .role_grant_permission(
            "jobs-locker",
            etcd_client::Permission::read_write("jobs/").with_prefix(),
        )
        .await
        .expect("grant");
    admin
        .user_add("locker", "lockerpw", None)
        .await
        .expect("user");
    admin
        .user_grant_role("locker", "jobs-locker")
        .await
        .expect("grant role");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin.auth_enable().await.expect("auth");

    let run = |namespace: &str| {
        let mut command = fencelock();
        command
            .args(["--etcd", &etcd.endpoint(0), "--namespace", namespace])
            .args(["--user", "locker", "--lock", "nightly", "--", "true"])
            .env("FENCELOCK_ETCD_PASSWORD", "lockerpw")
            .stderr(Stdio::piped());
        command
    };
    let output = run("jobs").output().await.expect("run");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = run("payments").output().await.expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");

    // No password anywhere: a usage error that says where to put it.
    let output = fencelock()
        .args([
            "--etcd",
            &etcd.endpoint(0),
            "--user",
            "locker",
            "--lock",
            "x",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("FENCELOCK_ETCD_PASSWORD"), "{stderr}");
}
