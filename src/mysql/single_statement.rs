//! The article's single-statement fence: the token lives in the data row itself.
//!
//! ```sql
//! UPDATE inventory SET available = available - 1, last_token = ?
//!  WHERE sku = ? AND (last_token IS NULL OR last_token < ?)
//!                                         -- 0 rows: a newer holder wrote first
//! ```
//!
//! The guard and the write are one statement, so they are atomic under every isolation
//! level: InnoDB evaluates an `UPDATE`'s `WHERE` on the latest committed row version
//! (after waiting for the row lock), never on a transaction's snapshot. The token always
//! changes on a match (strictly newer), so "rows affected" is the rows matched with or
//! without `CLIENT_FOUND_ROWS`. A NULL token column means no token has been seen yet: the
//! first fenced write takes it. The statement sent sets the token to
//! `? + 0 * LAST_INSERT_ID(<nonce>)`, so that its answer proves it is its own (see
//! `abandoned.rs`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::FenceError;
use super::abandoned::{condemn_queryable, nonce, proven_error};
use super::capacity::{self, Capacity};
use super::ident::Ident;
use super::rows::{describe, done, proven_pair, proven_text_pair};
use crate::FencingToken;

/// A table whose rows carry the token of their last writer in a column.
///
/// ```no_run
/// use fencelock::mysql::TokenColumn;
/// use fencelock::FencingToken;
///
/// # async fn run(conn: &mut mysql_async::Conn) -> Result<(), fencelock::mysql::FenceError> {
/// let inventory = TokenColumn::new("inventory", "sku", "last_token")?;
/// // UPDATE `inventory` SET available = available - 1, `last_token` = ?
/// //  WHERE `sku` = ? AND (`last_token` IS NULL OR `last_token` < ?)
/// inventory
///     .update(conn, "available = available - 1", "SKU-1", FencingToken::new(42), vec![])
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TokenColumn {
    table: Ident,
    key: Ident,
    token: Ident,
    /// What the token column holds, per place it was read at (shared by clones).
    capacity: Arc<Mutex<HashMap<Place, Arc<Capacity>>>>,
}

/// Where an update writes: the server (`@@hostname:@@port`) and the table's database.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Place {
    server: Vec<u8>,
    database: String,
}

impl TokenColumn {
    /// Names the table, its key column and its token column (a `BIGINT UNSIGNED`, which
    /// may be NULL on rows no fenced write has touched yet).
    pub fn new(table: &str, key_column: &str, token_column: &str) -> Result<Self, FenceError> {
        Ok(Self {
            table: Ident::parse(table)?,
            key: Ident::parse(key_column)?,
            token: Ident::parse(token_column)?,
            capacity: Arc::default(),
        })
    }

    /// Where an update on `conn` writes now: its server, and the table's database (the
    /// one in its name, else the connection's current one). Asked over the text protocol,
    /// which answers the connection's current database: a statement mysql_async prepared
    /// and cached before a `USE` keeps the database it was prepared in (its unqualified
    /// tables and its `DATABASE()` alike, MariaDB 10.11). A `SELECT` of the session's
    /// state, never written to the binary log (but behind a proxy that sends reads to
    /// replicas it may be answered by one: see [`update`](Self::update)).
    async fn place(&self, conn: &mut impl Queryable) -> Result<Place, FenceError> {
        let proof = nonce();
        let sql = format!(
            "SELECT CAST(CONCAT_WS(':', @@hostname, @@port) AS BINARY), \
             CAST(DATABASE() AS BINARY), {proof}"
        );
        let read: Option<(Vec<u8>, Option<Vec<u8>>)> =
            match proven_text_pair(conn, &sql, proof).await {
                Ok(read) => read,
                Err(err) => return Err(proven_error(conn, err).await),
            };
        let Some((server, current)) = read else {
            return Err(condemn_queryable(conn));
        };
        let database = match (self.table.parts().0, current) {
            (Some(named), _) => named.to_owned(),
            (None, Some(current)) => String::from_utf8(current).map_err(|_| {
                FenceError::Database(mysql_async::Error::Other(
                    "the connection's database name is not UTF-8".into(),
                ))
            })?,
            (None, None) => {
                return Err(FenceError::Database(mysql_async::Error::Other(
                    format!(
                        "no database selected for the table {} (name it with its database, \
                         or connect to one)",
                        self.table.sql()
                    )
                    .into(),
                )));
            }
        };
        Ok(Place { server, database })
    }

    /// The largest token the token column holds exactly at `place`, read from
    /// `information_schema` the first time it is asked for there and kept; `None` if the
    /// column is not listed there (not kept: the update is refused, and a column added
    /// later is read then).
    async fn capacity(
        &self,
        conn: &mut impl Queryable,
        place: &Place,
    ) -> Result<Option<Arc<Capacity>>, FenceError> {
        if let Some(known) = self
            .capacity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(place)
        {
            return Ok(Some(known.clone()));
        }
        let Some(found) =
            capacity::read_in(conn, Some(&place.database), &self.table, &self.token).await?
        else {
            return Ok(None);
        };
        let found = Arc::new(found);
        self.capacity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(place.clone(), found.clone());
        Ok(Some(found))
    }

    /// What ends the text of each statement an update sends for a table named without its
    /// database: a comment naming the place's database (hex), so that mysql_async, which
    /// caches prepared statements by their text per connection, prepares a statement for
    /// each database apart, each one right after [`place`](Self::place) found the
    /// connection in that database: its unqualified table is the one whose column was
    /// checked. (A statement prepared before a `USE` keeps the database it was prepared
    /// in.) The name itself stays unqualified, as the caller wrote it: statement-based
    /// replication's `replicate-rewrite-db` rewrites only the default database.
    fn prepared_for(&self, place: &Place) -> String {
        if self.table.parts().0.is_some() {
            return String::new();
        }
        let mut hex = String::with_capacity(place.database.len() * 2);
        for byte in place.database.bytes() {
            let _ = write!(hex, "{byte:02x}");
        }
        format!(" /* fencelock-db {hex} */")
    }

    /// `UPDATE <table> SET <set>, <token> = ? WHERE <key> = ? AND (<token> IS NULL OR
    /// <token> < ?)`.
    ///
    /// `set` is the caller's own SQL (never user input); its `?` placeholders come first
    /// in the statement, so they are bound from `params`, in order, before the token and
    /// the key. Strictly newer tokens only: the token is the last writer's, so an equal
    /// one would be a repeat. Returns the rows updated; with none, tells a stale token
    /// ([`FenceError::Stale`], with the stored token) from a missing row
    /// ([`FenceError::NotFound`]). A token the column cannot hold is refused before
    /// anything is sent ([`FenceError::TokenOutOfRange`]): outside strict SQL mode the
    /// server would store it cut to fit, and let every later token through. The column's
    /// type is read from `information_schema` at the first update at each place (server
    /// and database) through this value or a clone of it, and kept for that place; every
    /// update first asks the connection where it is (one light round trip, a `SELECT` of
    /// the session's state) and sends a statement prepared for that database, so that one
    /// `TokenColumn` used on connections to several databases or servers never writes a
    /// token into a column it did not check there. A token column that information_schema
    /// does not list (a `TEMPORARY` table) is refused
    /// ([`FenceError::UnknownTokenColumn`]): nothing is written unchecked. Behind a proxy
    /// that sends reads to replicas (ProxySQL, MaxScale readwritesplit), run it inside a
    /// transaction or on a direct connection: the checks must reach the server that
    /// writes. Two servers answering the same
    /// `@@hostname` and `@@port` are one place to it: use a `TokenColumn` per server
    /// where that can happen. An `ALTER` of the column while it is in use is not seen.
    ///
    /// # Cancel safety
    ///
    /// Outside a transaction the statement is applied or not as one; dropping the future
    /// after it was sent leaves which one unknown (a retry with the same token is then
    /// refused as stale if it was applied).
    ///
    /// Any future dropped mid-statement on the connection (this one or another) leaves
    /// its answers one behind; this call then fails with
    /// [`FenceError::ConnectionUnusable`] (its statement's outcome unknown) instead of
    /// reading another statement's answer: drop the connection.
    #[tracing::instrument(skip_all, fields(table = self.table.sql(), token = %token))]
    pub async fn update(
        &self,
        conn: &mut impl Queryable,
        set: &str,
        key: impl Into<Value>,
        token: FencingToken,
        params: Vec<Value>,
    ) -> Result<u64, FenceError> {
        let place = self.place(conn).await?;
        let (table, key_col, token_col) = (self.table.sql(), self.key.sql(), self.token.sql());
        let at = self.prepared_for(&place);
        let key: Value = key.into();
        let Some(capacity) = self.capacity(conn, &place).await? else {
            // Nothing is sent to a column that could not be checked (a TEMPORARY table,
            // which information_schema does not list; one not created yet).
            return Err(FenceError::UnknownTokenColumn {
                column: format!("{table}.{token_col} (database {:?})", place.database),
            });
        };
        if token.get() > capacity.max {
            return Err(FenceError::TokenOutOfRange {
                resource: describe(&key),
                token,
                column: format!("{table}.{token_col} ({})", capacity.column_type),
            });
        }
        // `+ 0 * LAST_INSERT_ID(<nonce>)`: the answer proves it is this statement's (the
        // server reports the value in the OK packet of an UPDATE that matched a row; see
        // abandoned.rs and Fence's guarded UPDATE).
        let sql = format!(
            "UPDATE {table} SET {set}, {token_col} = ? + 0 * LAST_INSERT_ID(?) \
             WHERE {key_col} = ? AND ({token_col} IS NULL OR {token_col} < ?){at}"
        );
        let value = Value::UInt(token.get());
        let proof = nonce();
        let mut all = params;
        all.extend([value.clone(), Value::UInt(proof), key.clone(), value]);
        let updated = match done(conn, &sql, all).await {
            Ok(updated) => updated,
            Err(err) => return Err(proven_error(conn, err).await),
        };
        match (updated.affected, updated.insert_id) {
            (rows, id) if rows > 0 && id == proof => return Ok(rows),
            (0, 0) => {}
            _ => return Err(condemn_queryable(conn)),
        }
        // A locking read: inside a REPEATABLE READ transaction a plain one could answer
        // from the transaction's older snapshot. An aggregate: one row (carrying the
        // nonce) whether the key exists or not.
        let proof = nonce();
        let sql = format!(
            "SELECT COUNT(*), MAX({token_col}), ? FROM {table} WHERE {key_col} = ? \
             LOCK IN SHARE MODE{at}"
        );
        let resource = describe(&key);
        let read =
            match proven_pair::<u64, Option<u64>>(conn, &sql, vec![Value::UInt(proof), key], proof)
                .await
            {
                Ok(read) => read,
                Err(err) => return Err(proven_error(conn, err).await),
            };
        match read {
            None => Err(condemn_queryable(conn)),
            Some((0, _)) => Err(FenceError::NotFound { resource }),
            Some((_, stored)) => Err(FenceError::Stale {
                resource,
                presented: token,
                // NULL only if another writer set it back to NULL in between.
                current: FencingToken::new(stored.unwrap_or(0)),
            }),
        }
    }
}
