//! `fencelock chaos` against a mutual-TLS etcd it was given: the TLS flags reach every
//! worker process, also through the fault proxies of S6, and the outcomes are those of
//! plaintext.

use fencelock::testkit::{EtcdCluster, TestPki};

use super::{chaos, count, row};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_runs_over_mutual_tls_with_the_same_outcomes() {
    let pki = TestPki::generate().expect("pki");
    let etcd = EtcdCluster::builder()
        .tls(
            pki.server_tls(true),
            pki.client_tls("root").expect("client"),
        )
        .start()
        .await
        .expect("mTLS etcd");
    let client = pki.client("chaos").expect("client cert");
    let ca = pki.ca_cert().display().to_string();
    let (cert, key) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let endpoint = etcd.endpoint(0);
    let (rows, success) = tokio::task::spawn_blocking(move || {
        chaos(&[
            "--scenario",
            "S1,S6",
            "--backends",
            "etcd",
            "--etcd",
            &endpoint,
            "--etcd-cacert",
            &ca,
            "--etcd-cert",
            &cert,
            "--etcd-key",
            &key,
        ])
    })
    .await
    .expect("chaos");
    for scenario in ["S1", "S6"] {
        let r = row(&rows, scenario, "etcd");
        assert_eq!(count(r, "stale_accepted"), 0, "{r:#}");
        assert!(count(r, "sections") >= 3, "{r:#}");
        assert_eq!(r["as_expected"], true, "{r:#}");
    }
    assert!(success, "{rows:#?}");
}
