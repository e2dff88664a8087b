//! What fencing costs a write, measured in one run against a local PostgreSQL this example
//! starts itself: the median of a plain transaction (BEGIN; UPDATE; COMMIT) next to the
//! same transaction passing the fence first.
//!
//! `cargo run --release --example fenced_write_cost`

use std::time::{Duration, Instant};

use fencelock::FencingToken;
use fencelock::postgres::Fence;
use fencelock::testkit::PostgresServer;

const WRITES: usize = 2000;
const UPDATE: &str = "UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-1'";

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = PostgresServer::start().await?;
    let database = server.create_database().await?;
    let mut client = server.connect(&database).await?;
    client
        .batch_execute(
            "CREATE TABLE inventory (sku text PRIMARY KEY, available bigint NOT NULL); \
             INSERT INTO inventory VALUES ('SKU-1', 1000000000);",
        )
        .await?;
    let fence = Fence::new();
    fence.ensure_schema(&client).await?;

    let mut plain = Vec::with_capacity(WRITES);
    let mut fenced = Vec::with_capacity(WRITES);
    for i in 0..WRITES {
        let started = Instant::now();
        let tx = client.transaction().await?;
        tx.execute(UPDATE, &[]).await?;
        tx.commit().await?;
        plain.push(started.elapsed());

        let token = FencingToken::new(u64::try_from(i)? + 1);
        let started = Instant::now();
        let tx = fence.begin(&mut client, "SKU-1", token).await?;
        tx.execute(UPDATE, &[]).await?;
        tx.commit().await?;
        fenced.push(started.elapsed());
    }
    let (plain, fenced) = (median(plain), median(fenced));
    println!("postgres on port {} (fsync off)", server.port());
    println!("plain write  (BEGIN; UPDATE; COMMIT)        median {plain:?} over {WRITES}");
    println!("fenced write (BEGIN; fence; UPDATE; COMMIT) median {fenced:?} over {WRITES}");
    println!(
        "fenced / plain = {:.2}",
        fenced.as_secs_f64() / plain.as_secs_f64()
    );
    Ok(())
}
