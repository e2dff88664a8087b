//! Idempotency keys: the first request with a key proceeds, every repeat is recognised.
//!
//! No lock, no TTL, no token: the database's unique constraint does the excluding.
//!
//! ```sql
//! INSERT INTO fencelock_idempotency (key) VALUES ($1) ON CONFLICT (key) DO NOTHING RETURNING key
//! ```

use tokio_postgres::GenericClient;

use super::FenceError;
use super::ident::Ident;

/// What claiming a key found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Claim {
    /// This request is the first with the key: go ahead.
    First,
    /// A request with this key was already claimed: take the duplicate path.
    Duplicate,
}

/// A table of claimed idempotency keys.
#[derive(Clone, Debug)]
pub struct IdempotencyKeys {
    table: Ident,
}

impl Default for IdempotencyKeys {
    fn default() -> Self {
        Self {
            table: Ident::trusted("\"public\".\"fencelock_idempotency\""),
        }
    }
}

impl IdempotencyKeys {
    /// Keys in table `public.fencelock_idempotency` (schema-qualified, as the fence's).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys in another table (with a unique text column `key`).
    pub fn with_table(table: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
        })
    }

    /// Creates the table if it does not exist (explicitly, once).
    pub async fn ensure_schema(&self, client: &impl GenericClient) -> Result<(), FenceError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               key text PRIMARY KEY, \
               claimed_at timestamptz NOT NULL DEFAULT now())",
            self.table.sql()
        );
        client.batch_execute(&sql).await?;
        Ok(())
    }

    /// Claims `key`. Run it in the same transaction as the work it protects, so that a
    /// rolled-back attempt frees the key again.
    pub async fn claim(&self, client: &impl GenericClient, key: &str) -> Result<Claim, FenceError> {
        let sql = format!(
            "INSERT INTO {} (key) VALUES ($1) ON CONFLICT (key) DO NOTHING RETURNING key",
            self.table.sql()
        );
        let row = client.query_opt(&sql, &[&key]).await?;
        Ok(if row.is_some() {
            Claim::First
        } else {
            Claim::Duplicate
        })
    }
}
