//! The TLS variant of the compose deployment (`compose/docker-compose.tls.yml`, with the
//! certificates of `compose/make-certs.sh`): mutual TLS for etcd, TLS for Redis and
//! PostgreSQL; `fencelock bench` runs against it with the TLS flags.

use std::process::Command;

use super::compose;

#[test]
fn the_tls_deployment_runs_the_benchmark_over_tls() {
    let certs = tempfile::tempdir().expect("tempdir");
    let made = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/compose/make-certs.sh"
        ))
        .arg(certs.path())
        .output()
        .expect("make-certs.sh");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let project = compose::up_with(
        &["compose/docker-compose.tls.yml"],
        vec![(
            "FENCELOCK_CERTS_DIR".into(),
            certs.path().display().to_string(),
        )],
    );
    let cert = |file: &str| certs.path().join(file).display().to_string();
    let etcd = [
        "FENCELOCK_ETCD1_PORT",
        "FENCELOCK_ETCD2_PORT",
        "FENCELOCK_ETCD3_PORT",
    ]
    .map(|v| format!("https://127.0.0.1:{}", project.port(v)))
    .join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bench.json");
    let bench = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "bench",
            // Every cell these backends have (the default runs the headline rows only).
            "--full",
            "--duration",
            "2s",
            "--concurrency",
            "1",
            "--waiters",
            "2",
        ])
        .args(["--renewal-locks", "0", "--backends", "etcd,redis,postgres"])
        .args(["--etcd", &etcd])
        .args(["--etcd-cacert", &cert("ca.pem")])
        .args(["--etcd-cert", &cert("client.pem")])
        .args(["--etcd-key", &cert("client-key.pem")])
        .args([
            "--redis",
            &format!(
                "rediss://127.0.0.1:{}/",
                project.port("FENCELOCK_REDIS_PORT")
            ),
        ])
        .args(["--redis-cacert", &cert("ca.pem")])
        .args([
            "--postgres",
            &format!(
                "host=127.0.0.1 port={} user=postgres password=fencelock",
                project.port("FENCELOCK_POSTGRES_PORT")
            ),
        ])
        .args(["--postgres-cacert", &cert("ca.pem")])
        .arg("--json")
        .arg(&json)
        .arg("--no-report")
        .output()
        .expect("fencelock bench");
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("bench json")).expect("json");
    let text = report.to_string();
    for subject in ["etcd", "redis", "postgres"] {
        assert!(text.contains(subject), "no {subject} figures in {report:#}");
    }

    // Plaintext to the TLS deployment is refused with the reason.
    let plain = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "run",
            "--etcd",
            &etcd.replace("https://", "http://"),
            "--lock",
            "x",
        ])
        .args(["--", "true"])
        .output()
        .expect("fencelock run");
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(plain.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("expects TLS"), "{stderr}");
}
