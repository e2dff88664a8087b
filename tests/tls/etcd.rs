//! etcd over TLS and mutual TLS: what works, and each bad input's typed error.

use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::testkit::{EtcdCluster, TestPki};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, TlsConfig};

use crate::support::{CONNECT_TIMEOUT, refused};

fn config(endpoint: &str) -> EtcdConfig {
    EtcdConfig::new([endpoint])
        .with_namespace("tls")
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_request_timeout(CONNECT_TIMEOUT)
}

async fn lock_and_release(config: EtcdConfig) -> Result<(), LockError> {
    let locks = EtcdLocker::connect(config).await?;
    let guard = locks.lock("secure", &LockOptions::new()).await?;
    let released = guard.release().await?;
    assert_eq!(released, fencelock::ReleaseOutcome::Released);
    locks.close().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_and_every_bad_input_gets_a_typed_error() {
    let pki = TestPki::generate().expect("pki");
    let mtls = EtcdCluster::builder()
        .tls(
            pki.server_tls(true),
            pki.client_tls("root").expect("client"),
        )
        .start()
        .await
        .expect("mTLS etcd");
    let endpoint = mtls.endpoint(0);
    assert!(endpoint.starts_with("https://"));
    let client = pki.client_tls("locker").expect("client cert");

    // The right CA and a client certificate: it works.
    lock_and_release(config(&endpoint).with_tls(client.clone()))
        .await
        .expect("mutual TLS");

    let missing = pki.dir().join("no-such-ca.pem");
    let garbage = pki.dir().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let err = refused(
        "unreadable CA file",
        lock_and_release(config(&endpoint).with_tls(TlsConfig::new().with_ca_file(&missing))),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("no-such-ca.pem"), "{err}");
    let err = refused(
        "malformed CA PEM",
        lock_and_release(config(&endpoint).with_tls(TlsConfig::new().with_ca_file(&garbage))),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("garbage.pem"), "{err}");
    let pair = pki.client("locker").expect("client");
    let err = refused(
        "malformed client key",
        lock_and_release(
            config(&endpoint).with_tls(
                TlsConfig::new()
                    .with_ca_file(pki.ca_cert())
                    .with_identity_files(&pair.cert, &garbage),
            ),
        ),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("garbage.pem"), "{err}");

    let err = refused(
        "unknown CA",
        lock_and_release(
            config(&endpoint).with_tls(
                TlsConfig::new()
                    .with_ca_file(pki.untrusted_ca())
                    .with_identity_files(&pair.cert, &pair.key),
            ),
        ),
        LockError::is_tls,
    )
    .await;
    assert!(
        err.to_string().contains("certificate verify failed"),
        "{err}"
    );

    let err = refused(
        "no client certificate where one is required",
        lock_and_release(config(&endpoint).with_tls(pki.ca_only_tls())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("client certificate"), "{err}");

    let err = refused(
        "plaintext client to a TLS server",
        lock_and_release(config(&endpoint.replace("https://", "http://"))),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("https://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_server_certificates_and_plaintext_servers_are_named() {
    let pki = TestPki::generate().expect("pki");
    let ca_only = pki.ca_only_tls();
    let expired = EtcdCluster::builder()
        .tls(
            pki.server_tls_with(pki.expired_server(), false),
            ca_only.clone(),
        )
        .start()
        .await
        .expect("etcd with an expired certificate");
    let err = refused(
        "expired server certificate",
        lock_and_release(config(&expired.endpoint(0)).with_tls(ca_only.clone())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("expired"), "{err}");

    let misnamed = EtcdCluster::builder()
        .tls(
            pki.server_tls_with(pki.misnamed_server(), false),
            ca_only.clone(),
        )
        .start()
        .await
        .expect("etcd with a certificate for another name");
    let err = refused(
        "server name mismatch",
        lock_and_release(config(&misnamed.endpoint(0)).with_tls(ca_only.clone())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("not valid for"), "{err}");
    // The name the certificate does carry, set explicitly: it works.
    lock_and_release(
        config(&misnamed.endpoint(0))
            .with_tls(ca_only.clone().with_server_name("elsewhere.invalid")),
    )
    .await
    .expect("the expected server name set");

    let plain = EtcdCluster::single().await.expect("plaintext etcd");
    let err = refused(
        "TLS client to a plaintext server",
        lock_and_release(
            config(&plain.endpoint(0).replace("http://", "https://")).with_tls(ca_only),
        ),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("plaintext endpoint"), "{err}");
}
