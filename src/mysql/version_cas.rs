//! Optimistic compare-and-set on a version column: mutual exclusion pushed down to the row.
//!
//! ```sql
//! UPDATE account SET balance = balance - 100, version = version + 1
//!  WHERE id = ? AND version = ?     -- 0 rows: someone changed it first, retry
//! ```
//!
//! The version always changes on a match, so "rows affected" is the rows matched with or
//! without `CLIENT_FOUND_ROWS`. The statement sent adds `SIGN(LAST_INSERT_ID(<nonce>))`
//! (1) instead of 1, so that its answer proves it is its own (see `abandoned.rs`).

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::FenceError;
use super::abandoned::{condemn_queryable, nonce, proven_error};
use super::ident::Ident;
use super::rows::{describe, done, proven_pair};

/// A table whose rows carry a `BIGINT` version, bumped by every write.
#[derive(Clone, Debug)]
pub struct VersionColumn {
    table: Ident,
    key: Ident,
    version: Ident,
}

impl VersionColumn {
    /// Names the table, its key column and its version column.
    pub fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
            key: Ident::parse(key_column)?,
            version: Ident::parse(version_column)?,
        })
    }

    /// `UPDATE <table> SET <set>, <version> = <version> + 1 WHERE <key> = ? AND
    /// <version> = ?`; returns the new version, or [`FenceError::VersionConflict`] with
    /// the version found (re-read and retry). `set` is the caller's SQL; its `?`
    /// placeholders come first in the statement, bound from `params` in order.
    ///
    /// # Cancel safety
    ///
    /// Outside a transaction the statement is applied or not as one; dropping the future
    /// after it was sent leaves which one unknown (a retry then reports a conflict).
    ///
    /// Any future dropped mid-statement on the connection (this one or another) leaves
    /// its answers one behind; this call then fails with
    /// [`FenceError::ConnectionUnusable`] (its statement's outcome unknown) instead of
    /// reading another statement's answer: drop the connection.
    #[tracing::instrument(skip_all, fields(table = self.table.sql(), expected))]
    pub async fn compare_and_set(
        &self,
        conn: &mut impl Queryable,
        set: &str,
        key: impl Into<Value>,
        expected: i64,
        params: Vec<Value>,
    ) -> Result<i64, FenceError> {
        let (table, key_col, version) = (self.table.sql(), self.key.sql(), self.version.sql());
        let key: Value = key.into();
        // `+ SIGN(LAST_INSERT_ID(<nonce>))` (1: the nonce is at least 1; signed, so that
        // a negative version stays signed): the answer proves it is this statement's
        // (see abandoned.rs and Fence's guarded UPDATE).
        let sql = format!(
            "UPDATE {table} SET {set}, {version} = {version} + SIGN(LAST_INSERT_ID(?)) \
             WHERE {key_col} = ? AND {version} = ?"
        );
        let proof = nonce();
        let mut all = params;
        all.extend([Value::UInt(proof), key.clone(), Value::Int(expected)]);
        let updated = match done(conn, &sql, all).await {
            Ok(updated) => updated,
            Err(err) => return Err(proven_error(conn, err).await),
        };
        match (updated.affected, updated.insert_id) {
            // The row had `expected` and the statement added one: no read needed. (At
            // i64::MAX the server refuses the UPDATE itself: out of range.)
            (rows, id) if rows > 0 && id == proof => return Ok(expected.saturating_add(1)),
            (0, 0) => {}
            _ => return Err(condemn_queryable(conn)),
        }
        // A locking read, so that a REPEATABLE READ snapshot cannot hide the version
        // that won; an aggregate, so that one row carries the nonce either way.
        let proof = nonce();
        let sql = format!(
            "SELECT COUNT(*), MAX({version}), ? FROM {table} WHERE {key_col} = ? \
             LOCK IN SHARE MODE"
        );
        let resource = describe(&key);
        let read =
            proven_pair::<u64, Option<i64>>(conn, &sql, vec![Value::UInt(proof), key], proof)
                .await?;
        let Some((found, version)) = read else {
            return Err(condemn_queryable(conn));
        };
        let current = if found == 0 { None } else { version };
        Err(FenceError::VersionConflict {
            resource,
            expected,
            current,
        })
    }
}
