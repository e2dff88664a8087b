//! Helpers shared by the MariaDB tests: one server for the whole test binary, one
//! database per test.

use std::time::Duration;

use fencelock::testkit::MariaDbServer;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel};
use tokio::sync::OnceCell;

static SERVER: OnceCell<MariaDbServer> = OnceCell::const_new();

/// Stops the shared server when the test binary exits (statics are never dropped).
extern "C" fn stop_shared_server() {
    if let Some(server) = SERVER.get() {
        server.stop_and_remove();
    }
}

/// The server every test of this binary shares, started by the first to ask.
pub async fn server() -> &'static MariaDbServer {
    SERVER
        .get_or_init(|| async {
            let server = MariaDbServer::start().await.expect("start mariadbd");
            // SAFETY: registers a plain function; it runs once, at exit.
            unsafe { libc::atexit(stop_shared_server) };
            server
        })
        .await
}

/// Both isolation levels the guarantee is promised under.
pub const LEVELS: [IsolationLevel; 2] = [
    IsolationLevel::RepeatableRead,
    IsolationLevel::ReadCommitted,
];

/// A database of this test's own on the shared server, and a connection to it.
pub struct Db {
    pub server: &'static MariaDbServer,
    pub name: String,
    pub conn: Conn,
}

impl Db {
    pub async fn start() -> Self {
        let server = server().await;
        let name = server.create_database().await.expect("create database");
        let conn = server.connect(&name).await.expect("connect");
        Self { server, name, conn }
    }

    /// Another connection to the same database.
    pub async fn connect(&self) -> Conn {
        self.server.connect(&self.name).await.expect("connect")
    }

    /// Another connection whose transactions run at `level` by default.
    pub async fn connect_at(&self, level: IsolationLevel) -> Conn {
        let mut conn = self.connect().await;
        conn.query_drop(format!(
            "SET SESSION TRANSACTION ISOLATION LEVEL {}",
            sql(level)
        ))
        .await
        .expect("set isolation level");
        conn
    }

    /// A table `inventory(sku primary key, available, last_token, written_by, version)`
    /// with one row `SKU-1`.
    pub async fn inventory(&mut self) {
        self.conn
            .query_drop(
                "CREATE TABLE inventory (sku VARCHAR(64) PRIMARY KEY, available INT NOT NULL, \
                   last_token BIGINT UNSIGNED NULL, written_by VARCHAR(64), \
                   version BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB",
            )
            .await
            .expect("create inventory");
        self.conn
            .query_drop("INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100)")
            .await
            .expect("insert SKU-1");
    }

    /// `inventory` with an `INT UNSIGNED` token column (narrower than tokens can grow),
    /// and its row `SKU-1`.
    pub async fn narrow_inventory(&mut self) {
        self.conn
            .query_drop(
                "CREATE TABLE inventory (sku VARCHAR(64) PRIMARY KEY, available INT NOT NULL, \
                   last_token INT UNSIGNED NULL) ENGINE=InnoDB; \
                 INSERT INTO inventory (sku, available) VALUES ('SKU-1', 100)",
            )
            .await
            .expect("a narrow inventory");
    }

    /// Another connection, outside strict SQL mode (where a number too large for its
    /// column is cut to fit, with a warning only).
    pub async fn non_strict(&self) -> Conn {
        let mut conn = self.connect().await;
        conn.query_drop("SET SESSION sql_mode = ''")
            .await
            .expect("non-strict");
        conn
    }

    /// (available, written_by) of `SKU-1`.
    pub async fn sku(&mut self) -> (i32, Option<String>) {
        self.conn
            .query_first("SELECT available, written_by FROM inventory WHERE sku = 'SKU-1'")
            .await
            .expect("read")
            .expect("a row")
    }
}

/// Waits until another connection to this test's database has been running one
/// statement for over 200 ms while the holder sits idle in its open transaction: a writer
/// queued behind the fence row, not merely slow to start. (PROCESSLIST, not InnoDB's
/// INNODB_TRX: that one is a cache InnoDB refreshes only after 100 ms without readers,
/// which tests polling in parallel never leave it.)
pub async fn until_a_writer_waits_for_the_lock(db: &mut Db) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<u64> = db
            .conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE DB = ? AND ID <> CONNECTION_ID() \
                   AND COMMAND IN ('Query', 'Execute') AND TIME_MS > 200",
                (&db.name,),
            )
            .await
            .expect("PROCESSLIST");
        if waiting.unwrap_or(0) > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no writer waited for the fence row within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The level as SQL.
pub fn sql(level: IsolationLevel) -> &'static str {
    match level {
        IsolationLevel::ReadUncommitted => "READ UNCOMMITTED",
        IsolationLevel::ReadCommitted => "READ COMMITTED",
        IsolationLevel::RepeatableRead => "REPEATABLE READ",
        IsolationLevel::Serializable => "SERIALIZABLE",
    }
}

/// The write every fenced-write test protects.
pub const DECREMENT: &str =
    "UPDATE inventory SET available = available - 1, written_by = ? WHERE sku = 'SKU-1'";
