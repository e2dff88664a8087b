//! The suite runs against the server it was asked to run: CI sets
//! `FENCELOCK_EXPECT_REDIS_VERSION` (`redis 8.0`, `valkey 8.1`) beside `FENCELOCK_REDIS_BIN`,
//! so that a binary that silently fell back to `PATH`'s redis-server fails here.

use crate::support::redis;

#[tokio::test]
async fn the_server_is_the_expected_one() {
    let server = redis().await;
    let mut connection = server.connection().await.expect("connection");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    // Valkey also reports a redis_version, for compatibility: its own name comes first.
    let reported = match (field("server_name"), field("valkey_version")) {
        (Some(name), Some(version)) => format!("{name} {version}"),
        _ => format!("redis {}", field("redis_version").unwrap_or("?")),
    };
    let version = reported.split_once(' ').map_or("", |(_, v)| v);
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "the server reports {reported:?}"
    );
    if let Ok(expected) = std::env::var("FENCELOCK_EXPECT_REDIS_VERSION") {
        assert!(
            reported == expected || reported.starts_with(&format!("{expected}.")),
            "expected {expected}, the server reports {reported}"
        );
    }
}
