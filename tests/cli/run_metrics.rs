//! `fencelock run --metrics-listen`: while the command holds the lock, a Prometheus scrape
//! over loopback (curl, from the command itself) shows the lock held, its grant and its
//! acquisition time, without lock names as labels unless asked.

use fencelock::testkit::{EtcdCluster, free_port};

use crate::support::fencelock_run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_the_lock_metrics_for_prometheus() {
    let etcd = EtcdCluster::single().await.expect("etcd");
    let port = free_port().expect("port");
    let address = format!("127.0.0.1:{port}");
    let scrape = format!("curl --silent --show-error --fail http://{address}/metrics");
    let output = fencelock_run(&etcd.endpoints(), "cli-metrics")
        .args(["--lock", "job", "--ttl", "2s", "--metrics-listen", &address])
        .args(["--", "sh", "-c", &scrape])
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .expect("fencelock run");
    let body = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}: {}{body}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    let sample = |name: &str, labels: &[&str]| -> Option<f64> {
        body.lines()
            .filter(|line| line.starts_with(name))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
    };
    assert_eq!(
        sample("fencelock_locks_held{", &["backend=\"etcd\""]),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample("fencelock_grants_total{", &["backend=\"etcd\""]),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            "fencelock_acquire_seconds_count{",
            &["backend=\"etcd\"", "outcome=\"acquired\""]
        ),
        Some(1.0),
        "{body}"
    );
    // Lock names are labels only on request (`--metrics-lock-names`; the library's
    // tests/metrics cover that side).
    assert!(!body.contains("lock=\"job\""), "{body}");
}
