//! Concurrent writers with shuffled tokens: the stored state is the newest token's, and
//! every accepted write carried a token at least as new as every write committed before.

use std::sync::Arc;

use fencelock::FencingToken;
use fencelock::postgres::Fence;

use crate::support::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_newest_tokens_state_survives() {
    let db = Db::start().await;
    db.inventory().await;
    let fence = Arc::new(Fence::new());
    fence.ensure_schema(&db.client).await.expect("schema");

    // Tokens 1..=24 in a scrambled but fixed order.
    let tokens: Vec<u64> = (0..24u64).map(|i| (i * 7) % 24 + 1).collect();
    let mut tasks = Vec::new();
    for token in tokens {
        let mut client = db.connect().await;
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            let result = fence
                .begin(&mut client, "SKU-1", FencingToken::new(token))
                .await;
            match result {
                Ok(tx) => {
                    let by = format!("token-{token}");
                    tx.execute(
                        "UPDATE inventory SET written_by = $1, last_token = $2 WHERE sku = 'SKU-1'",
                        &[&by, &i64::try_from(token).expect("small")],
                    )
                    .await
                    .expect("write");
                    tx.commit().await.expect("commit");
                    true
                }
                Err(err) if err.is_stale() => false,
                Err(err) => panic!("unexpected: {err}"),
            }
        }));
    }
    let mut accepted = 0;
    for task in tasks {
        if task.await.expect("task") {
            accepted += 1;
        }
    }
    assert!(accepted >= 1);
    assert_eq!(db.sku().await.1.as_deref(), Some("token-24"));
    let row = db
        .client
        .query_one("SELECT last_token FROM inventory WHERE sku = 'SKU-1'", &[])
        .await
        .expect("read");
    assert_eq!(row.get::<_, i64>(0), 24);
}
