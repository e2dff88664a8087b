//! Connection failures come back typed: wrong credentials are "permission denied", no
//! server is "unavailable", TLS asked of a plaintext server is a TLS error, a malformed
//! URL is invalid input; and the password never shows in the message.

use fencelock::testkit::{MariaDbServer, free_port};
use fencelock::{LockError, TlsConfig};

use crate::support::server;

async fn refused(case: &str, url: &str, tls: Option<&TlsConfig>) -> LockError {
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        fencelock::mysql::connect(url, tls),
    )
    .await
    .unwrap_or_else(|_| panic!("{case}: hung for 10 s"));
    let err = outcome.expect_err(case);
    eprintln!("{case}: {err}");
    err
}

#[tokio::test]
async fn each_failure_has_its_kind() {
    let server = server().await;
    let port = server.port();
    let user = MariaDbServer::USER;

    let good = server.url("mysql");
    let mut conn = fencelock::mysql::connect(&good, None)
        .await
        .expect("the right password");
    mysql_async::prelude::Queryable::query_drop(&mut conn, "SELECT 1")
        .await
        .expect("query");

    let err = refused(
        "wrong password",
        &format!("mysql://{user}:not-the-password@127.0.0.1:{port}/mysql"),
        None,
    )
    .await;
    assert!(err.is_permission_denied(), "{err:?}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");

    let err = refused(
        "unknown user",
        &format!("mysql://nobody:pw@127.0.0.1:{port}/mysql"),
        None,
    )
    .await;
    assert!(err.is_permission_denied(), "{err:?}");

    let nothing = free_port().expect("port");
    let err = refused(
        "no server",
        &format!("mysql://{user}:pw@127.0.0.1:{nothing}/mysql"),
        None,
    )
    .await;
    assert!(err.is_unavailable(), "{err:?}");

    let err = refused("TLS to a plaintext server", &good, Some(&TlsConfig::new())).await;
    assert!(err.is_tls(), "{err:?}");

    let err = refused("not a URL", "postgres://somewhere/else", None).await;
    assert!(err.is_invalid_input(), "{err:?}");
}
