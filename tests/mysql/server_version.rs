//! The suite runs against the server it was asked to run: CI may set
//! `FENCELOCK_EXPECT_MARIADB_VERSION` (e.g. `10.11`) beside `FENCELOCK_MARIADB_BIN`, so that
//! a server that silently fell back to another binary fails here.

use crate::support::server;

#[tokio::test]
async fn the_server_is_the_expected_one() {
    let reported = server().await.version().await.expect("VERSION()");
    // "10.11.6-MariaDB-0+deb12u2": the number first.
    let version = reported.split('-').next().unwrap_or_default().to_owned();
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "the server reports {reported:?}"
    );
    assert!(
        reported.contains("MariaDB"),
        "the server reports {reported:?}"
    );
    if let Ok(expected) = std::env::var("FENCELOCK_EXPECT_MARIADB_VERSION") {
        assert!(
            version == expected || version.starts_with(&format!("{expected}.")),
            "expected MariaDB {expected}, the server reports {reported}"
        );
    }
}
