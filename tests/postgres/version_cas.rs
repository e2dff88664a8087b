//! Optimistic compare-and-set: the writer with the current version wins; the other
//! learns the version it lost to.

use fencelock::postgres::{FenceError, VersionColumn};

use crate::support::Db;

#[tokio::test]
async fn the_second_writer_with_the_same_version_conflicts() {
    let db = Db::start().await;
    db.inventory().await;
    let rows = VersionColumn::new("inventory", "sku", "version").expect("names");
    let set = "available = available - $3";

    let version = rows
        .compare_and_set(&db.client, set, &"SKU-1", 0, &[&10i32])
        .await
        .expect("first writer");
    assert_eq!(version, 1);
    let err = rows
        .compare_and_set(&db.client, set, &"SKU-1", 0, &[&10i32])
        .await
        .expect_err("stale version");
    assert!(
        matches!(
            err,
            FenceError::VersionConflict {
                expected: 0,
                current: Some(1),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_conflict());
    assert_eq!(db.sku().await.0, 90);
}
