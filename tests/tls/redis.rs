//! Redis over TLS and mutual TLS: what works, and each bad input's typed error.

use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::{RedisServer, TestPki};
use fencelock::{LockBackend, LockError, LockGuard, LockOptions, ReleaseOutcome, TlsConfig};

use crate::support::{CONNECT_TIMEOUT, refused};

fn config(url: &str) -> RedisConfig {
    RedisConfig::new(url)
        .with_prefix("tls")
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_request_timeout(CONNECT_TIMEOUT)
}

async fn lock_and_release(config: RedisConfig) -> Result<(), LockError> {
    let locks = RedisLocker::connect(config).await?;
    let guard = locks.lock("secure", &LockOptions::new()).await?;
    assert_eq!(guard.release().await?, ReleaseOutcome::Released);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_and_every_bad_input_gets_a_typed_error() {
    let pki = TestPki::generate().expect("pki");
    let client = pki.client_tls("locker").expect("client");
    let server = RedisServer::start_tls(pki.server_tls(true), client.clone())
        .await
        .expect("redis with mutual TLS");
    let url = server.url();
    assert!(url.starts_with("rediss://"));
    lock_and_release(config(&url).with_tls(client.clone()))
        .await
        .expect("mutual TLS");

    let garbage = pki.dir().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let err = refused(
        "unreadable CA file",
        lock_and_release(
            config(&url).with_tls(TlsConfig::new().with_ca_file(pki.dir().join("nope.pem"))),
        ),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("nope.pem"), "{err}");
    let err = refused(
        "malformed CA PEM",
        lock_and_release(config(&url).with_tls(TlsConfig::new().with_ca_file(&garbage))),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("garbage.pem"), "{err}");
    let pair = pki.client("locker").expect("client");
    let err = refused(
        "unknown CA",
        lock_and_release(
            config(&url).with_tls(
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
        lock_and_release(config(&url).with_tls(pki.ca_only_tls())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("client certificate"), "{err}");
    let err = refused(
        "plaintext client to a TLS server",
        lock_and_release(config(&url.replace("rediss://", "redis://"))),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("rediss://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_server_certificates_and_plaintext_servers_are_named() {
    let pki = TestPki::generate().expect("pki");
    let ca_only = pki.ca_only_tls();
    let expired = RedisServer::start_tls(
        pki.server_tls_with(pki.expired_server(), false),
        ca_only.clone(),
    )
    .await
    .expect("redis with an expired certificate");
    let err = refused(
        "expired server certificate",
        lock_and_release(config(&expired.url()).with_tls(ca_only.clone())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("expired"), "{err}");
    let misnamed = RedisServer::start_tls(
        pki.server_tls_with(pki.misnamed_server(), false),
        ca_only.clone(),
    )
    .await
    .expect("redis with a certificate for another name");
    let err = refused(
        "server name mismatch",
        lock_and_release(config(&misnamed.url()).with_tls(ca_only.clone())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("not valid for"), "{err}");

    let plain = RedisServer::start().await.expect("plaintext redis");
    let err = refused(
        "TLS client to a plaintext server",
        lock_and_release(config(&plain.url().replace("redis://", "rediss://")).with_tls(ca_only)),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("plaintext"), "{err}");
}
