//! One holder may write several times with its token; the strict form allows one write
//! per token.

use fencelock::FencingToken;
use fencelock::postgres::{Fence, FenceMode};

use crate::support::Db;

const DECREMENT: &str = "UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-1'";

#[tokio::test]
async fn repeated_writes_with_the_same_token_succeed() {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new();
    fence.ensure_schema(&db.client).await.expect("schema");
    for _ in 0..3 {
        let tx = fence
            .begin(&mut db.client, "SKU-1", FencingToken::new(7))
            .await
            .expect("fence");
        tx.execute(DECREMENT, &[]).await.expect("write");
        tx.commit().await.expect("commit");
    }
    assert_eq!(db.sku().await.0, 97);
}

#[tokio::test]
async fn the_strict_fence_accepts_each_token_once() {
    let mut db = Db::start().await;
    db.inventory().await;
    let fence = Fence::new()
        .with_table("strict_fences")
        .expect("table")
        .with_mode(FenceMode::Strict);
    fence.ensure_schema(&db.client).await.expect("schema");
    let tx = fence
        .begin(&mut db.client, "SKU-1", FencingToken::new(7))
        .await
        .expect("fence");
    tx.execute(DECREMENT, &[]).await.expect("write");
    tx.commit().await.expect("commit");
    let again = fence
        .begin(&mut db.client, "SKU-1", FencingToken::new(7))
        .await;
    assert!(again.expect_err("equal token refused").is_stale());
    assert_eq!(db.sku().await.0, 99);
}
