//! Names that could inject SQL are refused before any statement is built.

use fencelock::postgres::{Fence, FenceError, IdempotencyKeys, TokenColumn, VersionColumn};

#[test]
fn unsafe_identifiers_are_refused() {
    let bad = "inventory; DROP TABLE users";
    assert!(matches!(
        Fence::new().with_table(bad),
        Err(FenceError::InvalidIdentifier(_))
    ));
    assert!(matches!(
        IdempotencyKeys::with_table(bad),
        Err(FenceError::InvalidIdentifier(_))
    ));
    assert!(matches!(
        TokenColumn::new("inventory", bad, "last_token"),
        Err(FenceError::InvalidIdentifier(_))
    ));
    assert!(matches!(
        VersionColumn::new("inventory", "sku", "version\""),
        Err(FenceError::InvalidIdentifier(_))
    ));
}

#[tokio::test]
async fn a_malformed_connection_string_is_a_typed_error() {
    let err = fencelock::postgres::PgAdvisoryLocker::connect("host=127.0.0.1 port=notaport")
        .await
        .expect_err("refused");
    assert!(err.is_invalid_input(), "{err}");
}
