//! The compose deployment for users (`compose/docker-compose.yml`): brought up on the local
//! images, `fencelock bench --duration 5s` run against it, brought down.

use std::process::Command;

use super::compose;

#[test]
fn the_compose_deployment_runs_the_benchmark() {
    let project = compose::up();

    let etcd = [
        "FENCELOCK_ETCD1_PORT",
        "FENCELOCK_ETCD2_PORT",
        "FENCELOCK_ETCD3_PORT",
    ]
    .map(|v| format!("http://127.0.0.1:{}", project.port(v)))
    .join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bench.json");
    let bench = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "bench",
            // Every cell these backends have (the default runs the headline rows only).
            "--full",
            "--duration",
            "5s",
            "--concurrency",
            "1",
            "--waiters",
            "2",
        ])
        .args(["--renewal-locks", "0", "--backends", "etcd,redis,postgres"])
        .args(["--etcd", &etcd])
        .args([
            "--redis",
            &format!(
                "redis://127.0.0.1:{}/",
                project.port("FENCELOCK_REDIS_PORT")
            ),
        ])
        .args([
            "--postgres",
            &format!(
                "host=127.0.0.1 port={} user=postgres password=fencelock",
                project.port("FENCELOCK_POSTGRES_PORT")
            ),
        ])
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
}
