//! Optimistic compare-and-set: the expected version writes and bumps it; an old one gets
//! the version found; a missing row gets none.

use fencelock::mysql::{FenceError, VersionColumn};

use crate::support::Db;

#[tokio::test]
async fn the_expected_version_wins_and_an_old_one_sees_the_current() {
    let mut db = Db::start().await;
    db.inventory().await;
    let cas = VersionColumn::new("inventory", "sku", "version").expect("names");
    let set = "available = available - ?";
    let v1 = cas
        .compare_and_set(&mut db.conn, set, "SKU-1", 0, vec![10.into()])
        .await
        .expect("version 0 is current");
    assert_eq!(v1, 1);
    let err = cas
        .compare_and_set(&mut db.conn, set, "SKU-1", 0, vec![10.into()])
        .await
        .expect_err("version 0 is gone");
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
    let err = cas
        .compare_and_set(&mut db.conn, set, "SKU-404", 0, vec![10.into()])
        .await
        .expect_err("no row");
    assert!(
        matches!(err, FenceError::VersionConflict { current: None, .. }),
        "{err}"
    );
    assert_eq!(db.sku().await.0, 90);
}
