//! Helpers shared by the PostgreSQL tests.

use fencelock::testkit::PostgresServer;
use tokio_postgres::Client;

/// A server of this test's own, a fresh database on it, and a connection to that.
pub struct Db {
    pub server: PostgresServer,
    pub name: String,
    pub client: Client,
}

impl Db {
    pub async fn start() -> Self {
        let server = PostgresServer::start().await.expect("start postgres");
        let name = server.create_database().await.expect("create database");
        let client = server.connect(&name).await.expect("connect");
        Self {
            server,
            name,
            client,
        }
    }

    /// Another connection to the same database.
    pub async fn connect(&self) -> Client {
        self.server.connect(&self.name).await.expect("connect")
    }

    /// A table `inventory(sku text primary key, available int, last_token bigint,
    /// written_by text, version bigint)` with one row `SKU-1`.
    pub async fn inventory(&self) {
        self.client
            .batch_execute(
                "CREATE TABLE inventory (sku text PRIMARY KEY, available int NOT NULL, \
                   last_token bigint NOT NULL DEFAULT 0, written_by text, \
                   version bigint NOT NULL DEFAULT 0); \
                 INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100);",
            )
            .await
            .expect("create inventory");
    }

    /// (available, written_by) of `SKU-1`.
    pub async fn sku(&self) -> (i32, Option<String>) {
        let row = self
            .client
            .query_one(
                "SELECT available, written_by FROM inventory WHERE sku = 'SKU-1'",
                &[],
            )
            .await
            .expect("read");
        (row.get(0), row.get(1))
    }
}

/// The write the fenced-write tests protect: `SKU-1` taken by `$1`.
pub const DECREMENT: &str =
    "UPDATE inventory SET available = available - 1, written_by = $1 WHERE sku = 'SKU-1'";
