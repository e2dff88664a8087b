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

use std::sync::{Arc, Mutex, PoisonError};

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::FenceError;
use super::abandoned::{condemn_queryable, nonce, proven_error};
use super::capacity::{self, Capacity, PLACE, database_param};
use super::ident::Ident;
use super::rows::{describe, done, proven_pair};
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
    /// What the token column held when last read, and where (shared by clones): a guess,
    /// checked by every statement that writes (`capacity::PLACE`).
    capacity: Arc<Mutex<Option<Arc<Known>>>>,
}

/// The token column's capacity (`None`: no such column), and the place it was read at
/// (`capacity::PLACE`: server and database).
#[derive(Debug, PartialEq, Eq)]
struct Known {
    place: Vec<u8>,
    capacity: Option<Capacity>,
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

    /// The token column's capacity as last read, if any.
    fn cached(&self) -> Option<Arc<Known>> {
        self.capacity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the token column's capacity from `information_schema` (the connection's
    /// database, for a table named without one), and where, and keeps it.
    async fn read_capacity(&self, conn: &mut impl Queryable) -> Result<Arc<Known>, FenceError> {
        let (place, capacity) = capacity::read_at(conn, &self.table, &self.token).await?;
        let read = Arc::new(Known { place, capacity });
        *self.capacity.lock().unwrap_or_else(PoisonError::into_inner) = Some(read.clone());
        Ok(read)
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
    /// type is read from `information_schema` at the first update through this value (or
    /// a clone of it) and kept with where it was read (server and database), and every
    /// statement that writes applies only where it was read: one `TokenColumn` used on
    /// connections to several databases or servers (a table named without its database)
    /// writes nothing into a column it did not check. Such an update reads the column
    /// again (one round trip) and tries once more. An `ALTER` of the column while a
    /// `TokenColumn` is in use is not seen: make a new one after it.
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
        let key: Value = key.into();
        // Whether `known` was read for this update (else it is a guess, from before).
        let (mut known, mut fresh) = match self.cached() {
            Some(known) => (known, false),
            None => (self.read_capacity(conn).await?, true),
        };
        loop {
            let tried = self
                .try_update(conn, set, &key, token, &params, &known)
                .await?;
            match tried {
                Tried::Updated(rows) => return Ok(rows),
                // The guess may be another place's (server, database): the column is read
                // again, and the update tried once more if that changed anything.
                Tried::OutOfRange | Tried::NoMatch if !fresh => {
                    let read = self.read_capacity(conn).await?;
                    fresh = true;
                    if read != known {
                        known = read;
                        continue;
                    }
                }
                Tried::OutOfRange | Tried::NoMatch => {}
            }
            return match (tried, &known.capacity) {
                (Tried::OutOfRange, Some(capacity)) => Err(FenceError::TokenOutOfRange {
                    resource: describe(&key),
                    token,
                    column: format!(
                        "{}.{} ({})",
                        self.table.sql(),
                        self.token.sql(),
                        capacity.column_type
                    ),
                }),
                _ => self.refusal(conn, key, token).await,
            };
        }
    }

    /// One guarded `UPDATE`, after checking the token against `known` (the capacity of
    /// the token column as last read). The statement applies only at the place `known`
    /// was read at (`capacity::PLACE`, evaluated by the statement itself): never into a
    /// column whose capacity was not checked (with none there, the server's own error).
    async fn try_update(
        &self,
        conn: &mut impl Queryable,
        set: &str,
        key: &Value,
        token: FencingToken,
        params: &[Value],
        known: &Known,
    ) -> Result<Tried, FenceError> {
        if known
            .capacity
            .as_ref()
            .is_some_and(|capacity| token.get() > capacity.max)
        {
            return Ok(Tried::OutOfRange);
        }
        let (table, key_col, token_col) = (self.table.sql(), self.key.sql(), self.token.sql());
        // `+ 0 * LAST_INSERT_ID(<nonce>)`: the answer proves it is this statement's (the
        // server reports the value in the OK packet of an UPDATE that matched a row; see
        // abandoned.rs and Fence's guarded UPDATE).
        let sql = format!(
            "UPDATE {table} SET {set}, {token_col} = ? + 0 * LAST_INSERT_ID(?) \
             WHERE {key_col} = ? AND ({token_col} IS NULL OR {token_col} < ?) \
             AND {PLACE} <=> CAST(? AS BINARY)"
        );
        let value = Value::UInt(token.get());
        let proof = nonce();
        let mut all = params.to_vec();
        all.extend([value.clone(), Value::UInt(proof), key.clone(), value]);
        all.extend([
            database_param(&self.table),
            Value::Bytes(known.place.clone()),
        ]);
        let updated = match done(conn, &sql, all).await {
            Ok(updated) => updated,
            Err(err) => return Err(proven_error(conn, err).await),
        };
        match (updated.affected, updated.insert_id) {
            (rows, id) if rows > 0 && id == proof => Ok(Tried::Updated(rows)),
            (0, 0) => Ok(Tried::NoMatch),
            _ => Err(condemn_queryable(conn)),
        }
    }

    /// Why a guarded `UPDATE` that matched nothing did: a stale token, or no such row.
    async fn refusal(
        &self,
        conn: &mut impl Queryable,
        key: Value,
        token: FencingToken,
    ) -> Result<u64, FenceError> {
        let (table, key_col, token_col) = (self.table.sql(), self.key.sql(), self.token.sql());
        // A locking read: inside a REPEATABLE READ transaction a plain one could answer
        // from the transaction's older snapshot. An aggregate: one row (carrying the
        // nonce) whether the key exists or not.
        let proof = nonce();
        let sql = format!(
            "SELECT COUNT(*), MAX({token_col}), ? FROM {table} WHERE {key_col} = ? \
             LOCK IN SHARE MODE"
        );
        let resource = describe(&key);
        let read =
            proven_pair::<u64, Option<u64>>(conn, &sql, vec![Value::UInt(proof), key], proof)
                .await?;
        match read {
            None => Err(condemn_queryable(conn)),
            Some((0, _)) => Err(FenceError::NotFound { resource }),
            // Not stale, yet not matched: the statement's column was not the one read (its
            // statements, prepared on either side of a `USE`, disagree on the database).
            Some((_, stored)) if stored.is_none_or(|stored| stored < token.get()) => {
                Err(condemn_queryable(conn))
            }
            Some((_, stored)) => Err(FenceError::Stale {
                resource,
                presented: token,
                // NULL only if another writer set it back to NULL in between.
                current: FencingToken::new(stored.unwrap_or(0)),
            }),
        }
    }
}

/// What one guarded `UPDATE` did.
enum Tried {
    /// It wrote this many rows.
    Updated(u64),
    /// It was not sent: the token is above the capacity it was checked against.
    OutOfRange,
    /// It matched nothing: a stale token, no such row, or another place than the capacity
    /// was read at.
    NoMatch,
}
