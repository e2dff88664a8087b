//! The shared rows the critical sections update: a counter written through the fence
//! and the same counter written without it, side by side.
//!
//! Both are read-modify-writes whose read happens before the work and whose write after
//! it, as in the article: the unfenced one loses an update whenever two holders overlap;
//! the fenced one reads and writes through the fence (the read registers the token, so
//! a holder that paused after reading cannot write over a newer holder's update).

use fencelock::FencingToken;
use fencelock::postgres::{Fence, FenceError, FenceMode};
use tokio_postgres::Client;

use super::checker::Write;

const COUNTERS: &str = "fencelock_chaos_counters";
const COMMIT_ORDER: &str = "fencelock_chaos_commit_order";

/// The final values of one run's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub fenced: i64,
    pub unfenced: i64,
}

/// A connection to the rows of one run (`run` names the rows and the fenced resource).
pub struct Store {
    client: Client,
    run: String,
    /// Reads register the token strictly: a repeated token (Redis after a failover) is
    /// refused instead of trusted.
    read_fence: Fence,
    /// Writes accept the token the read registered.
    write_fence: Fence,
}

impl Store {
    /// Connects (over TLS with `tls`); the connection task runs until the store is
    /// dropped.
    pub async fn connect(
        url: &str,
        run: &str,
        tls: Option<&fencelock::TlsConfig>,
    ) -> Result<Self, fencelock::LockError> {
        let client = fencelock::postgres::connect(url, tls).await?;
        Ok(Self {
            client,
            run: run.to_owned(),
            read_fence: Fence::new().with_mode(FenceMode::Strict),
            write_fence: Fence::new(),
        })
    }

    /// Creates the tables (if needed) and this run's two counters at zero.
    pub async fn prepare(&self) -> Result<(), FenceError> {
        self.write_fence.ensure_schema(&self.client).await?;
        self.client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {COUNTERS} (name text PRIMARY KEY, value bigint NOT NULL); \
                 CREATE SEQUENCE IF NOT EXISTS {COMMIT_ORDER};"
            ))
            .await?;
        for row in [self.fenced_row(), self.unfenced_row()] {
            self.client
                .execute(
                    &format!(
                        "INSERT INTO {COUNTERS} (name, value) VALUES ($1, 0) \
                         ON CONFLICT (name) DO UPDATE SET value = 0"
                    ),
                    &[&row],
                )
                .await?;
        }
        Ok(())
    }

    /// The counters now.
    pub async fn counts(&self) -> Result<Counts, tokio_postgres::Error> {
        Ok(Counts {
            fenced: self.value(&self.fenced_row()).await?,
            unfenced: self.value(&self.unfenced_row()).await?,
        })
    }

    /// Reads the fenced counter through the fence: `Err(Rejected)` if a token at least as
    /// new was seen, `Err(Failed)` if storage failed.
    pub async fn fenced_read(&mut self, token: FencingToken) -> Result<i64, Write> {
        let row = self.fenced_row();
        let tx = self
            .read_fence
            .begin(&mut self.client, &self.run, token)
            .await
            .map_err(as_write)?;
        let value = tx
            .query_one(
                &format!("SELECT value FROM {COUNTERS} WHERE name = $1"),
                &[&row],
            )
            .await
            .and_then(|r| r.try_get::<_, i64>(0))
            .map_err(|_| Write::Failed)?;
        tx.commit().await.map_err(as_write)?;
        Ok(value)
    }

    /// Writes `value` to the fenced counter if `token` is still the newest seen.
    pub async fn fenced_write(&mut self, token: FencingToken, value: i64) -> Write {
        let row = self.fenced_row();
        let tx = match self
            .write_fence
            .begin(&mut self.client, &self.run, token)
            .await
        {
            Ok(tx) => tx,
            Err(err) => return as_write(err),
        };
        // The fence row stays locked until commit, so sequence order is commit order.
        let order = tx
            .query_one(
                &format!(
                    "UPDATE {COUNTERS} SET value = $2 WHERE name = $1 \
                     RETURNING nextval('{COMMIT_ORDER}')"
                ),
                &[&row, &value],
            )
            .await
            .and_then(|r| r.try_get::<_, i64>(0));
        let Ok(order) = order else {
            return Write::Failed;
        };
        match tx.commit().await {
            Ok(()) => Write::Accepted {
                order: u64::try_from(order).unwrap_or(0),
            },
            Err(err) => as_write(err),
        }
    }

    /// Reads the unfenced counter.
    pub async fn unfenced_read(&self) -> Result<i64, tokio_postgres::Error> {
        self.value(&self.unfenced_row()).await
    }

    /// Writes `value` to the unfenced counter, unconditionally.
    pub async fn unfenced_write(&self, value: i64) -> Result<(), tokio_postgres::Error> {
        self.client
            .execute(
                &format!("UPDATE {COUNTERS} SET value = $2 WHERE name = $1"),
                &[&self.unfenced_row(), &value],
            )
            .await
            .map(drop)
    }

    async fn value(&self, row: &str) -> Result<i64, tokio_postgres::Error> {
        self.client
            .query_one(
                &format!("SELECT value FROM {COUNTERS} WHERE name = $1"),
                &[&row],
            )
            .await?
            .try_get(0)
    }

    fn fenced_row(&self) -> String {
        format!("{}:fenced", self.run)
    }

    fn unfenced_row(&self) -> String {
        format!("{}:unfenced", self.run)
    }
}

fn as_write(err: FenceError) -> Write {
    if err.is_stale() {
        Write::Rejected
    } else {
        Write::Failed
    }
}
