//! A write with token 41 after one with 42 is rejected, with both numbers, and changes
//! nothing.

use fencelock::FencingToken;
use fencelock::postgres::{Fence, FenceError};

use crate::support::{DECREMENT, Db};

#[tokio::test]
async fn an_older_token_is_rejected_and_applies_nothing() {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&db.client).await.expect("schema");

    let tx = fence
        .begin(&mut db.client, "SKU-1", FencingToken::new(42))
        .await
        .expect("fence");
    tx.execute(DECREMENT, &[&"holder-42"]).await.expect("write");
    tx.commit().await.expect("commit");

    let err = fence
        .begin(&mut db.client, "SKU-1", FencingToken::new(41))
        .await
        .expect_err("stale");
    match &err {
        FenceError::Stale {
            resource,
            presented,
            current,
        } => {
            assert_eq!(resource, "SKU-1");
            assert_eq!(*presented, FencingToken::new(41));
            assert_eq!(*current, FencingToken::new(42));
        }
        other => panic!("expected a stale-token error, got {other}"),
    }
    assert!(err.is_stale());
    assert_eq!(db.sku().await, (99, Some("holder-42".into())));
    assert_eq!(
        fence.current(&db.client, "SKU-1").await.expect("read"),
        Some(FencingToken::new(42))
    );
}
