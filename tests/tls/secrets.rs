//! Secrets never show: not in `Debug` or `Display` of any configuration or error, not in
//! tracing fields. Every configuration here holds a password and key material.

use std::sync::{Arc, Mutex};

use fencelock::etcd::{EtcdConfig, EtcdLocker};
use fencelock::redis::{RedisConfig, RedisLocker};
use fencelock::testkit::{EtcdCluster, PostgresServer, RedisServer};
use fencelock::{LockError, TlsConfig};

const PASSWORD: &str = "hunter2-s3cret";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nTOP-SECRET-KEY-BYTES\n-----END PRIVATE KEY-----\n";

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password: {text}"
    );
    assert!(
        !text.contains("TOP-SECRET-KEY-BYTES"),
        "{what} shows the key: {text}"
    );
}

fn tls() -> TlsConfig {
    TlsConfig::new()
        .with_ca_pem(b"-----BEGIN CERTIFICATE-----\n".to_vec())
        .with_identity_pem(
            b"-----BEGIN CERTIFICATE-----\n".to_vec(),
            KEY.as_bytes().to_vec(),
        )
}

/// Everything tracing records, at every level, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_configuration_error_or_trace_shows_a_password_or_a_key() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let etcd_config = EtcdConfig::new(["https://127.0.0.1:2379"])
        .with_credentials("root", PASSWORD)
        .with_tls(tls());
    assert_clean("EtcdConfig Debug", &format!("{etcd_config:?}"));
    let redis_config =
        RedisConfig::new(format!("rediss://locker:{PASSWORD}@127.0.0.1:6380/")).with_tls(tls());
    assert_clean("RedisConfig Debug", &format!("{redis_config:?}"));
    assert_clean("TlsConfig Debug", &format!("{:?}", tls()));

    // Real refusals, each with the secret in the request.
    let cluster = EtcdCluster::single().await.expect("etcd");
    let mut admin = cluster.client().await.expect("admin");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin.user_grant_role("root", "root").await.expect("role");
    admin.auth_enable().await.expect("auth");
    let mut errors: Vec<(&str, LockError)> = Vec::new();
    errors.push((
        "etcd wrong password",
        EtcdLocker::connect(cluster.config("s").with_credentials("root", PASSWORD))
            .await
            .expect_err("refused"),
    ));
    errors.push((
        "etcd unusable key",
        EtcdLocker::connect(cluster.config("s").with_tls(tls()))
            .await
            .expect_err("refused"),
    ));
    let redis = RedisServer::start().await.expect("redis");
    let mut conn = redis.connection().await.expect("admin");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("rightpw")
        .query_async::<()>(&mut conn)
        .await
        .expect("requirepass");
    errors.push((
        "redis wrong password",
        RedisLocker::connect(RedisConfig::new(
            redis
                .url()
                .replace("redis://", &format!("redis://:{PASSWORD}@")),
        ))
        .await
        .expect_err("refused"),
    ));
    let postgres = PostgresServer::start().await.expect("postgres");
    let pg = postgres.admin_connect("postgres").await.expect("admin");
    pg.batch_execute("CREATE ROLE fencer LOGIN PASSWORD 'rightpw'")
        .await
        .expect("role");
    errors.push((
        "postgres unusable key",
        fencelock::postgres::connect(
            &format!(
                "host=127.0.0.1 port={} user=fencer password={PASSWORD}",
                postgres.port()
            ),
            Some(&tls()),
        )
        .await
        .expect_err("refused"),
    ));
    for (what, err) in &errors {
        assert_clean(what, &err.to_string());
        assert_clean(what, &format!("{err:?}"));
    }
    assert!(errors[0].1.is_permission_denied(), "{}", errors[0].1);
    assert!(errors[2].1.is_permission_denied(), "{}", errors[2].1);

    let traced = String::from_utf8_lossy(
        &captured
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned();
    assert!(
        traced.contains("connect"),
        "tracing recorded the connects: {traced}"
    );
    assert_clean("tracing output", &traced);
}
