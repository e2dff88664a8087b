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

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::FenceError;
use super::abandoned::{condemn_queryable, nonce, proven_error};
use super::capacity::{self, Capacity};
use super::ident::Ident;
use super::rows::{describe, done, proven_first, proven_pair};
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
    /// What the token column holds, per database it was read in (shared by clones).
    capacity: Arc<Mutex<Capacities>>,
}

/// The token column's capacities read so far.
#[derive(Debug, Default)]
struct Capacities {
    /// By the database they were read in (`DATABASE()`'s bytes).
    by_database: HashMap<Option<Vec<u8>>, Arc<Known>>,
    /// The last one used: the first guess for the next update (a connection's database
    /// is not known before a statement asks).
    last: Option<Arc<Known>>,
}

/// A token column's capacity, and the connection's current database when it was read
/// (`DATABASE()`'s bytes: compared with what the same function answers later, whatever
/// the server does with the names' case).
#[derive(Debug)]
struct Known {
    database: Option<Vec<u8>>,
    capacity: Capacity,
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

    /// The largest token the token column holds exactly, and the database it was read in:
    /// the capacity last used if there is one and `database` is `None` (a first guess),
    /// else the one known for `database` (`Some`: the database a statement found the
    /// connection in), else read from `information_schema` (the connection's database,
    /// for a table named without one) and kept. `None` if the column does not exist (the
    /// write then fails with the server's error).
    async fn capacity(
        &self,
        conn: &mut impl Queryable,
        database: Option<&Option<Vec<u8>>>,
    ) -> Result<Option<Arc<Known>>, FenceError> {
        {
            let mut cache = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
            let found = match database {
                None => cache.last.clone(),
                Some(database) => cache.by_database.get(database).cloned(),
            };
            if let Some(known) = found {
                cache.last = Some(known.clone());
                return Ok(Some(known));
            }
        }
        let Some((database, capacity)) = capacity::read(conn, &self.table, &self.token).await?
        else {
            return Ok(None);
        };
        let known = Arc::new(Known { database, capacity });
        let mut cache = self.capacity.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .by_database
            .insert(known.database.clone(), known.clone());
        cache.last = Some(known.clone());
        Ok(Some(known))
    }

    /// The table as the statements name it: with the database its capacity was read in,
    /// when named without one, so that the table written is always the one whose column
    /// was checked, whatever database the server resolves an unqualified name in (a
    /// statement mysql_async prepared before a `USE` keeps the database it was prepared
    /// in).
    fn table_in<'a>(&'a self, known: Option<&Known>) -> Cow<'a, str> {
        let database = known
            .filter(|_| self.table.parts().0.is_none())
            .and_then(|known| known.database.as_deref())
            .and_then(|database| std::str::from_utf8(database).ok());
        match database {
            Some(database) => Cow::Owned(format!(
                "`{}`.{}",
                database.replace('`', "``"),
                self.table.sql()
            )),
            None => Cow::Borrowed(self.table.sql()),
        }
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
    /// a clone of it), in the connection's database for a table named without one; the
    /// statement then applies only in that database, and an update on a connection to
    /// another (or after a `USE`) reads the column there before it writes (one more round
    /// trip, and one more whenever the database changes).
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
        let mut found_in = None;
        loop {
            let known = self.capacity(conn, found_in.as_ref()).await?;
            match self
                .try_update(conn, set, &key, token, &params, known.as_deref())
                .await?
            {
                Tried::Updated(rows) => return Ok(rows),
                Tried::Refused => return self.refusal(conn, key, token, known.as_deref()).await,
                // The connection is in another database than the capacity was read in:
                // nothing was written (the statement's guard). Once more, with that
                // database's capacity.
                Tried::ElsewhereIn(database) if found_in.is_none() => {
                    found_in = Some(database);
                }
                // Its statements disagree on its database (some were prepared before a
                // `USE`, some after): drop it.
                Tried::ElsewhereIn(_) => return Err(condemn_queryable(conn)),
            }
        }
    }

    /// One guarded `UPDATE`, after checking the token against `known`. For a table named
    /// without its database, the statement applies only in the database `known` was read
    /// in (`DATABASE()`, compared byte for byte): a `TokenColumn` used on connections to
    /// several databases (or after a `USE`) never writes a token into a column whose
    /// capacity was never checked. Outside strict SQL mode a narrower column there
    /// would store it cut to fit, and let every later token through.
    async fn try_update(
        &self,
        conn: &mut impl Queryable,
        set: &str,
        key: &Value,
        token: FencingToken,
        params: &[Value],
        known: Option<&Known>,
    ) -> Result<Tried, FenceError> {
        let (table, key_col, token_col) = (self.table_in(known), self.key.sql(), self.token.sql());
        let database = known.filter(|_| self.table.parts().0.is_none());
        if let Some(known) = known {
            if token.get() > known.capacity.max {
                // Refused only on the capacity of this connection's database.
                if let Some(known) = database {
                    if let Some(elsewhere) = Self::elsewhere(conn, known).await? {
                        return Ok(Tried::ElsewhereIn(elsewhere));
                    }
                }
                return Err(FenceError::TokenOutOfRange {
                    resource: describe(key),
                    token,
                    column: format!("{table}.{token_col} ({})", known.capacity.column_type),
                });
            }
        }
        // `+ 0 * LAST_INSERT_ID(<nonce>)`: the answer proves it is this statement's (the
        // server reports the value in the OK packet of an UPDATE that matched a row; see
        // abandoned.rs and Fence's guarded UPDATE).
        let sql = format!(
            "UPDATE {table} SET {set}, {token_col} = ? + 0 * LAST_INSERT_ID(?) \
             WHERE {key_col} = ? AND ({token_col} IS NULL OR {token_col} < ?){}",
            if database.is_some() {
                " AND CAST(DATABASE() AS BINARY) <=> CAST(? AS BINARY)"
            } else {
                ""
            }
        );
        let value = Value::UInt(token.get());
        let proof = nonce();
        let mut all = params.to_vec();
        all.extend([value.clone(), Value::UInt(proof), key.clone(), value]);
        if let Some(known) = database {
            all.push(known.database.clone().map_or(Value::NULL, Value::Bytes));
        }
        let updated = match done(conn, &sql, all).await {
            Ok(updated) => updated,
            Err(err) => return Err(proven_error(conn, err).await),
        };
        match (updated.affected, updated.insert_id) {
            (rows, id) if rows > 0 && id == proof => return Ok(Tried::Updated(rows)),
            (0, 0) => {}
            _ => return Err(condemn_queryable(conn)),
        }
        // Nothing matched: refused, or guarded out in another database.
        match database {
            Some(known) => Ok(match Self::elsewhere(conn, known).await? {
                Some(elsewhere) => Tried::ElsewhereIn(elsewhere),
                None => Tried::Refused,
            }),
            None => Ok(Tried::Refused),
        }
    }

    /// The connection's database, if it is not the one `known` was read in (one round
    /// trip; only on the rare paths: a refusal, a token above the column's capacity).
    async fn elsewhere(
        conn: &mut impl Queryable,
        known: &Known,
    ) -> Result<Option<Option<Vec<u8>>>, FenceError> {
        let proof = nonce();
        let current: Option<Option<Vec<u8>>> = match proven_first(
            conn,
            "SELECT CAST(DATABASE() AS BINARY), ?",
            vec![Value::UInt(proof)],
            proof,
        )
        .await
        {
            Ok(current) => current,
            Err(err) => return Err(proven_error(conn, err).await),
        };
        match current {
            None => Err(condemn_queryable(conn)),
            Some(current) if current == known.database => Ok(None),
            Some(current) => Ok(Some(current)),
        }
    }

    /// Why a guarded `UPDATE` that matched nothing did: a stale token, or no such row.
    async fn refusal(
        &self,
        conn: &mut impl Queryable,
        key: Value,
        token: FencingToken,
        known: Option<&Known>,
    ) -> Result<u64, FenceError> {
        let (table, key_col, token_col) = (self.table_in(known), self.key.sql(), self.token.sql());
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
    /// It matched nothing in the database the capacity was read in.
    Refused,
    /// The connection is in this other database than the capacity was read in; nothing
    /// was written.
    ElsewhereIn(Option<Vec<u8>>),
}
