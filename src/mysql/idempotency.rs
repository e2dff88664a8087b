//! Idempotency keys: the first request with a key proceeds, every repeat is recognised.
//!
//! No lock, no TTL, no token: the database's unique constraint does the excluding.
//!
//! ```sql
//! INSERT INTO fencelock_idempotency (`key`) VALUES (IF(LAST_INSERT_ID(?) > 0, ?, NULL))
//! -- error 1062: a duplicate; "1 row" with last-insert-id = the nonce: the first claim
//! ```
//!
//! A plain `INSERT`, the duplicate told by its error: `INSERT IGNORE` would also turn
//! other errors (a key cut to the column's length outside strict mode) into warnings,
//! and `ON DUPLICATE KEY UPDATE` reports "1 row affected" for a duplicate under
//! `CLIENT_FOUND_ROWS`, the same as for a first insert. In InnoDB a duplicate-key error
//! rolls back the statement only, so the caller's transaction goes on.

use mysql_async::prelude::Queryable;
use mysql_async::{Error, Value};

use super::FenceError;
use super::abandoned::{condemn_queryable, in_step, nonce, proven_error};
use super::ident::{Ident, MAX_KEY, check_key};
use super::rows::done;

/// `ER_DUP_ENTRY`: the unique key already holds this value.
const ER_DUP_ENTRY: u16 = 1062;

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
            table: Ident::trusted("fencelock_idempotency"),
        }
    }
}

impl IdempotencyKeys {
    /// Keys in table `fencelock_idempotency`.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys in another table (with a unique column `key`, `VARBINARY` or a binary
    /// collation, so that keys differing in case or trailing spaces stay apart).
    pub fn with_table(table: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
        })
    }

    /// Creates the table (InnoDB) if it does not exist (explicitly, once).
    #[tracing::instrument(skip_all, fields(table = self.table.sql()))]
    pub async fn ensure_schema(&self, conn: &mut impl Queryable) -> Result<(), FenceError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               `key` VARBINARY({MAX_KEY}) NOT NULL PRIMARY KEY, \
               claimed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)\
             ) ENGINE=InnoDB",
            self.table.sql()
        );
        conn.query_drop(sql).await?;
        Ok(())
    }

    /// Claims `key` (1 to 255 bytes). Run it in the same transaction as the work it
    /// protects, so that a rolled-back attempt frees the key again. While another
    /// transaction holds the same key uncommitted, this waits for its outcome.
    ///
    /// # Cancel safety
    ///
    /// Outside a transaction, dropping the future after the statement was sent leaves
    /// the claim's outcome unknown (a retry then answers [`Claim::Duplicate`]). Inside
    /// one, roll the transaction back.
    ///
    /// Any future dropped mid-statement on the connection (this one or another) leaves
    /// its answers one behind; this call then fails with
    /// [`FenceError::ConnectionUnusable`] (its statement's outcome unknown) instead of
    /// reading another statement's answer: drop the connection.
    #[tracing::instrument(skip_all, fields(table = self.table.sql()))]
    pub async fn claim(&self, conn: &mut impl Queryable, key: &str) -> Result<Claim, FenceError> {
        check_key(key)?;
        // LAST_INSERT_ID(<nonce>), evaluated for the row inserted: the server reports the
        // value in the OK packet, so the answer proves it is this statement's (see
        // abandoned.rs); an OK without it is an earlier statement's.
        let sql = format!(
            "INSERT INTO {} (`key`) VALUES (IF(LAST_INSERT_ID(?) > 0, ?, NULL))",
            self.table.sql()
        );
        let proof = nonce();
        let params = vec![Value::UInt(proof), Value::Bytes(key.as_bytes().to_vec())];
        match done(conn, &sql, params).await {
            Ok(inserted) if inserted.affected == 1 && inserted.insert_id == proof => {
                Ok(Claim::First)
            }
            // A table with an AUTO_INCREMENT column: the server reports the id it
            // generated, not LAST_INSERT_ID(expr)'s value; the row was ours if the
            // connection answers in step after it.
            Ok(inserted) if inserted.affected == 1 && in_step(conn).await => Ok(Claim::First),
            Ok(_) => Err(condemn_queryable(conn)),
            // An error carries no nonce: a lagging duplicate of another key would make
            // this key's work never run.
            Err(Error::Server(server)) if server.code == ER_DUP_ENTRY => {
                if in_step(conn).await {
                    Ok(Claim::Duplicate)
                } else {
                    Err(condemn_queryable(conn))
                }
            }
            Err(err) => Err(proven_error(conn, err).await),
        }
    }
}
