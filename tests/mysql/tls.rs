//! MariaDB over TLS, through rustls: the fenced write works and the session is encrypted;
//! an untrusted server certificate, plaintext to a server that requires TLS, and a missing
//! client certificate each fail with their typed error.

use fencelock::FencingToken;
use fencelock::mysql::Fence;
use fencelock::testkit::{MariaDbServer, TestPki};
use mysql_async::prelude::Queryable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_works_and_bad_inputs_are_typed() {
    let pki = TestPki::generate().expect("pki");
    let server = MariaDbServer::start_tls(pki.server_tls(false))
        .await
        .expect("mariadbd with TLS");
    let url = server.url("mysql");

    let mut conn = fencelock::mysql::connect(&url, Some(&pki.ca_only_tls()))
        .await
        .expect("TLS with the CA");
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .expect("status");
    let cipher = cipher.map(|(_, value)| value).unwrap_or_default();
    assert!(!cipher.is_empty(), "the session is not encrypted");
    let fence = Fence::new();
    fence.ensure_schema(&mut conn).await.expect("schema");
    let tx = fence
        .begin(&mut conn, "tls", FencingToken::new(3))
        .await
        .expect("fenced write over TLS");
    tx.commit().await.expect("commit");

    let err = fencelock::mysql::connect(
        &url,
        Some(&fencelock::TlsConfig::new().with_ca_file(pki.untrusted_ca())),
    )
    .await
    .expect_err("unknown CA");
    assert!(err.is_tls(), "{err:?}");
    eprintln!("unknown CA: {err}");

    let err = fencelock::mysql::connect(&url, None)
        .await
        .expect_err("plaintext to a TLS-only server");
    // MariaDB answers a plaintext login under require_secure_transport with "Access
    // denied" (1045), the same as a wrong password (MySQL says "insecure transport",
    // 3159, which is a TLS error); either way the client learns nothing and sends no data.
    assert!(err.is_permission_denied() || err.is_tls(), "{err:?}");
    eprintln!("plaintext: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = TestPki::generate().expect("pki");
    let server = MariaDbServer::start_tls(pki.server_tls(true))
        .await
        .expect("mariadbd with mutual TLS");
    let url = server.url("mysql");
    let client = pki
        .client_tls(MariaDbServer::USER)
        .expect("client certificate");
    let mut conn = fencelock::mysql::connect(&url, Some(&client))
        .await
        .expect("mutual TLS");
    conn.query_drop("SELECT 1").await.expect("query");

    let err = fencelock::mysql::connect(&url, Some(&pki.ca_only_tls()))
        .await
        .expect_err("no client certificate");
    // The account says REQUIRE X509: the server refuses the login, not the handshake.
    assert!(err.is_permission_denied() || err.is_tls(), "{err:?}");
    eprintln!("no client certificate: {err}");
}
