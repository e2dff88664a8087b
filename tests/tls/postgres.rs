//! PostgreSQL over TLS (verify-full semantics) and mutual TLS, for the fence helpers and
//! the advisory-lock backend: what works, and each bad input's typed error.

use fencelock::postgres::{Fence, PgAdvisoryLocker};
use fencelock::testkit::{PostgresServer, TestPki};
use fencelock::{FencingToken, LockBackend, LockError, LockGuard, LockOptions, TlsConfig};

use crate::support::refused;

/// A connection string for `user` on `server` (2 s connect timeout).
fn conn(server: &PostgresServer, user: &str, extra: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} dbname=postgres connect_timeout=2 {extra}",
        server.port()
    )
}

async fn fenced_write(connection: &str, tls: Option<&TlsConfig>) -> Result<(), LockError> {
    let mut db = fencelock::postgres::connect(connection, tls).await?;
    let fence = Fence::new();
    fence
        .ensure_schema(&db)
        .await
        .map_err(|err| panic!("schema: {err}"))
        .ok();
    let tx = fence
        .begin(&mut db, "tls-resource", FencingToken::new(7))
        .await
        .map_err(|err| panic!("fenced write: {err}"))
        .ok();
    if let Some(tx) = tx {
        tx.commit()
            .await
            .map_err(|err| panic!("commit: {err}"))
            .ok();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_works_for_the_fence_and_the_advisory_lock_and_bad_inputs_are_typed() {
    let pki = TestPki::generate().expect("pki");
    let server = PostgresServer::start_tls(pki.server_tls(false))
        .await
        .expect("postgres with TLS");
    let ca_only = pki.ca_only_tls();
    fenced_write(&conn(&server, "postgres", ""), Some(&ca_only))
        .await
        .expect("fenced write over TLS");
    let locks = PgAdvisoryLocker::connect_with_tls(&conn(&server, "postgres", ""), &ca_only)
        .await
        .expect("advisory locks over TLS");
    locks.ensure_schema().await.expect("schema");
    let guard = locks.lock("tls", &LockOptions::new()).await.expect("lock");
    assert_eq!(
        guard.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );

    let garbage = pki.dir().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let err = refused(
        "malformed CA PEM",
        fenced_write(
            &conn(&server, "postgres", ""),
            Some(&TlsConfig::new().with_ca_file(&garbage)),
        ),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("garbage.pem"), "{err}");
    let err = refused(
        "unknown CA",
        fenced_write(
            &conn(&server, "postgres", ""),
            Some(&TlsConfig::new().with_ca_file(pki.untrusted_ca())),
        ),
        LockError::is_tls,
    )
    .await;
    assert!(
        err.to_string().contains("certificate verify failed"),
        "{err}"
    );
    let err = refused(
        "plaintext client to a server that accepts only TLS",
        fenced_write(&conn(&server, "postgres", "sslmode=disable"), None),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("only over TLS"), "{err}");
    let err = refused(
        "sslmode=disable with TLS configured",
        fenced_write(
            &conn(&server, "postgres", "sslmode=disable"),
            Some(&ca_only),
        ),
        LockError::is_invalid_input,
    )
    .await;
    assert!(err.to_string().contains("sslmode=disable"), "{err}");

    // Every role but `postgres` authenticates with a password here.
    let admin = server.admin_connect("postgres").await.expect("admin");
    admin
        .batch_execute("CREATE ROLE fencer LOGIN PASSWORD 'right-password'")
        .await
        .expect("role");
    let err = refused(
        "wrong password",
        fenced_write(
            &conn(&server, "fencer", "password=wrong-password"),
            Some(&ca_only),
        ),
        LockError::is_permission_denied,
    )
    .await;
    assert!(!err.to_string().contains("wrong-password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_bad_server_certificates_and_plaintext_servers() {
    let pki = TestPki::generate().expect("pki");
    let mtls = PostgresServer::start_tls(pki.server_tls(true))
        .await
        .expect("postgres with mutual TLS");
    // verify-full on the server side too: the certificate's name is the user's.
    fenced_write(
        &conn(&mtls, "postgres", ""),
        Some(&pki.client_tls("postgres").expect("client")),
    )
    .await
    .expect("mutual TLS");
    let err = refused(
        "no client certificate where one is required",
        fenced_write(&conn(&mtls, "postgres", ""), Some(&pki.ca_only_tls())),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("certificate"), "{err}");

    let ca_only = pki.ca_only_tls();
    let expired = PostgresServer::start_tls(pki.server_tls_with(pki.expired_server(), false))
        .await
        .expect("postgres with an expired certificate");
    let err = refused(
        "expired server certificate",
        fenced_write(&conn(&expired, "postgres", ""), Some(&ca_only)),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("expired"), "{err}");
    let misnamed = PostgresServer::start_tls(pki.server_tls_with(pki.misnamed_server(), false))
        .await
        .expect("postgres with a certificate for another name");
    let err = refused(
        "server name mismatch",
        fenced_write(&conn(&misnamed, "postgres", ""), Some(&ca_only)),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("not valid for"), "{err}");
    fenced_write(
        &conn(&misnamed, "postgres", ""),
        Some(&ca_only.clone().with_server_name("elsewhere.invalid")),
    )
    .await
    .expect("the expected server name set");

    let plain = PostgresServer::start().await.expect("plaintext postgres");
    let err = refused(
        "TLS client to a plaintext server",
        fenced_write(&conn(&plain, "postgres", ""), Some(&ca_only)),
        LockError::is_tls,
    )
    .await;
    assert!(err.to_string().contains("does not accept TLS"), "{err}");
}

/// A wait that times out over TLS cancels its statement over TLS too (the cancel
/// connection needs the same connector: the server takes only TLS here), sees the server
/// close the cancel connection, and so reuses the waiter's connection for the next lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_over_tls_cancels_and_reuses_its_connection() {
    let pki = TestPki::generate().expect("pki");
    let server = PostgresServer::start_tls(pki.server_tls(false))
        .await
        .expect("postgres with TLS");
    let ca_only = pki.ca_only_tls();
    let connect = || async {
        let locks = PgAdvisoryLocker::connect_with_tls(&conn(&server, "postgres", ""), &ca_only)
            .await
            .expect("advisory locks over TLS");
        locks.ensure_schema().await.expect("schema");
        locks
    };
    let (holder, waiter) = (connect().await, connect().await);
    let promptly = LockOptions::new().with_wait_timeout(std::time::Duration::from_secs(10));
    let probe = waiter.lock("probe", &promptly).await.expect("probe");
    let backend = probe.backend_pid();
    assert_eq!(
        probe.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );

    let held = holder.lock("tls-wait", &promptly).await.expect("lock");
    let wait = std::time::Duration::from_millis(200);
    let started = tokio::time::Instant::now();
    let err = waiter
        .lock("tls-wait", &LockOptions::new().with_wait_timeout(wait))
        .await
        .expect_err("the lock is held");
    let took = started.elapsed();
    assert!(err.is_wait_timeout(), "{err}");
    assert!(
        took < wait + std::time::Duration::from_secs(2),
        "the cancelled wait returned after {took:?}"
    );

    let next = waiter
        .lock("after-cancel", &promptly)
        .await
        .expect("lock after the cancel");
    assert_eq!(
        next.backend_pid(),
        backend,
        "the connection of the cancelled wait was not reused: the cancel over TLS was not \
         confirmed"
    );
    assert_eq!(
        next.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
    assert_eq!(
        held.release().await.expect("release"),
        fencelock::ReleaseOutcome::Released
    );
}
