//! The suite runs against the server it was asked to run: CI sets
//! `FENCELOCK_EXPECT_POSTGRES_VERSION` (e.g. `17`) beside `FENCELOCK_PG_BIN_DIR`, so that a
//! server that silently fell back to Debian 12's PostgreSQL 15 fails here.

use crate::support::Db;

#[tokio::test]
async fn the_server_is_the_expected_one() {
    let db = Db::start().await;
    let row = db
        .client
        .query_one("SHOW server_version", &[])
        .await
        .expect("SHOW server_version");
    let reported: String = row.get(0);
    // "17.6 (Debian 17.6-0+deb13u1)": the number first.
    let version = reported
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "the server reports {reported:?}"
    );
    if let Ok(expected) = std::env::var("FENCELOCK_EXPECT_POSTGRES_VERSION") {
        assert!(
            version == expected || version.starts_with(&format!("{expected}.")),
            "expected PostgreSQL {expected}, the server reports {reported}"
        );
    }
}
