//! The fence store: one row per resource holding the newest token seen, and writes that
//! apply only with a token at least that new.
//!
//! Three statements, in the caller's transaction (see the module docs for why each):
//!
//! ```sql
//! -- 1. Make the row exist and lock it (an exclusive record lock until the transaction
//! --    ends, under every isolation level); never changes a token.
//! INSERT INTO fencelock_fences (resource, token, writes) VALUES (?, NULL, 0)
//!   ON DUPLICATE KEY UPDATE resource = resource;
//! -- 2. Move the fence forward only if this token is new enough. `writes` changes on
//! --    every match, so "rows affected" is 1 exactly when the guard passed, with or
//! --    without CLIENT_FOUND_ROWS. LAST_INSERT_ID(<nonce>) is evaluated on the row it
//! --    matched, and the server reports its value in the OK packet's last-insert-id:
//! --    the answer proves it is this statement's (see abandoned.rs).
//! UPDATE fencelock_fences
//!    SET token = ?, writes = writes + 1 + 0 * LAST_INSERT_ID(?), updated_at = NOW(6)
//!  WHERE resource = ? AND (token IS NULL OR token <= ?);
//! -- 3. Only when 2 matched nothing: the newest token, for the error, and the nonce
//! --    that proves the answer. A locking read, because under REPEATABLE READ a plain
//! --    SELECT could answer from an older snapshot.
//! SELECT token, ? FROM fencelock_fences WHERE resource = ? FOR UPDATE;
//! ```
//!
//! `commit` sends `RELEASE SAVEPOINT ...; SELECT <nonce>` as one query (the savepoint
//! says the transaction is still the fenced one, the nonce that the answer is its own),
//! then `COMMIT`.

use std::ops::{Deref, DerefMut};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Transaction, TxOpts, Value};

use super::FenceError;
use super::abandoned::{condemn, condemn_queryable, in_step, nonce, usable};
use super::capacity;
use super::ident::{Ident, MAX_KEY, check_key};
use super::rows::{done, proven_first};
use crate::FencingToken;

/// Whether a token equal to the stored one may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FenceMode {
    /// Accept a token equal to the newest seen (the default). Equal tokens mean the same
    /// grant, so one holder can make several writes under one lock; a stale holder always
    /// carries an *older* token and is still refused.
    #[default]
    AllowEqual,
    /// Accept only a strictly newer token: each grant may write once. Use it where two
    /// grants could carry the same token (the Redis counter after a failover; PostgreSQL
    /// advisory-lock tokens after an asynchronous failover or a crash with
    /// `synchronous_commit = off`): the second is then refused instead of trusted.
    Strict,
}

/// Fenced writes in MariaDB or MySQL (InnoDB).
///
/// ```no_run
/// use fencelock::mysql::Fence;
/// use fencelock::FencingToken;
/// use mysql_async::prelude::Queryable;
///
/// # async fn run(conn: &mut mysql_async::Conn) -> Result<(), fencelock::mysql::FenceError> {
/// let fence = Fence::new();
/// fence.ensure_schema(&mut *conn).await?; // once, at deploy or start-up
///
/// let token = FencingToken::new(42); // from the lock guard
/// let mut tx = fence.begin(conn, "inventory:sku-1", token).await?;
/// tx.exec_drop("UPDATE inventory SET available = available - 1 WHERE sku = ?", ("SKU-1",))
///     .await?;
/// tx.commit().await?; // or a FenceError::Stale before anything ran
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Fence {
    table: Ident,
    mode: FenceMode,
    lock_sql: String,
    advance_sql: String,
    current_sql: String,
    read_sql: String,
}

impl Default for Fence {
    fn default() -> Self {
        Self::new()
    }
}

impl Fence {
    /// Fences in table `fencelock_fences`, accepting equal tokens.
    ///
    /// The name is unqualified, so each connection finds the table in its own default
    /// database (`DATABASE()`). Every writer of a resource must find the same table: two
    /// fence tables would each accept the other's stale tokens. If writers connect with
    /// different default databases (or none), name the table with its database,
    /// [`with_table("shop.fencelock_fences")`](Self::with_table), as PostgreSQL's
    /// default is schema-qualified.
    pub fn new() -> Self {
        Self::build(Ident::trusted("fencelock_fences"), FenceMode::AllowEqual)
    }

    /// Fences in another table (`name` or `database.name`).
    pub fn with_table(self, table: &str) -> Result<Self, FenceError> {
        Ok(Self::build(Ident::parse(table)?, self.mode))
    }

    /// Accepts equal tokens or not; see [`FenceMode`].
    pub fn with_mode(self, mode: FenceMode) -> Self {
        Self::build(self.table, mode)
    }

    fn build(table: Ident, mode: FenceMode) -> Self {
        let cmp = match mode {
            FenceMode::AllowEqual => "<=",
            FenceMode::Strict => "<",
        };
        let t = table.sql();
        // NULL: a row this transaction just created, which has seen no token yet. It is
        // never committed as NULL: the guarded UPDATE below always matches it.
        let lock_sql = format!(
            "INSERT INTO {t} (resource, token, writes) VALUES (?, NULL, 0) \
             ON DUPLICATE KEY UPDATE resource = resource"
        );
        let advance_sql = format!(
            "UPDATE {t} SET token = ?, writes = writes + 1 + 0 * LAST_INSERT_ID(?), \
             updated_at = NOW(6) WHERE resource = ? AND (token IS NULL OR token {cmp} ?)"
        );
        let current_sql = format!("SELECT token, ? FROM {t} WHERE resource = ? FOR UPDATE");
        // A scalar subquery: one row whether the fence row exists or not, so that the
        // nonce always comes back.
        let read_sql = format!("SELECT (SELECT token FROM {t} WHERE resource = ?), ?");
        Self {
            table,
            mode,
            lock_sql,
            advance_sql,
            current_sql,
            read_sql,
        }
    }

    /// The mode in use.
    #[must_use]
    pub fn mode(&self) -> FenceMode {
        self.mode
    }

    /// Creates the fence table (InnoDB) if it does not exist, and checks that an existing
    /// one's `token` column holds any token below 2^63 ([`FenceError::NarrowTokenColumn`]
    /// if not: it must be `BIGINT`, signed or `UNSIGNED`; with a signed one a larger token
    /// is refused by the write). Call it once (at deploy or start-up); writes never
    /// create schema implicitly.
    #[tracing::instrument(skip_all, fields(table = self.table.sql()))]
    pub async fn ensure_schema(&self, conn: &mut impl Queryable) -> Result<(), FenceError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               resource VARBINARY({MAX_KEY}) NOT NULL PRIMARY KEY, \
               token BIGINT UNSIGNED NULL, \
               writes BIGINT UNSIGNED NOT NULL DEFAULT 0, \
               updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)\
             ) ENGINE=InnoDB",
            self.table.sql()
        );
        conn.query_drop(sql).await?;
        let column = Ident::trusted("token");
        match capacity::read(conn, &self.table, &column).await? {
            // A signed BIGINT holds every token below 2^63, more than any backend hands
            // out; a token beyond it is refused by the write itself (the server's range
            // error in strict mode, the warning check outside it).
            Some(found) if found.max < SIGNED_BIGINT_MAX => Err(FenceError::NarrowTokenColumn {
                column: format!("{}.{}", self.table.sql(), column.sql()),
                column_type: found.column_type,
            }),
            _ => Ok(()),
        }
    }

    /// Begins a transaction (the session's isolation level) that has passed the fence
    /// for `resource` with `token`: run the protected statements on it, then
    /// [`commit`](FencedTransaction::commit). A stale token returns
    /// [`FenceError::Stale`] and the transaction is rolled back.
    ///
    /// # Cancel safety
    ///
    /// Nothing is committed unless [`commit`](FencedTransaction::commit) is called. A
    /// returned transaction that is dropped is rolled back by mysql_async before the
    /// connection's next command. Any statement on the connection dropped while it waits
    /// for its answer (this future, or a statement of yours, given up by a timeout while
    /// a row is locked) leaves the connection owing that answer, and after one more
    /// command of any kind every answer on it is one behind, unknown to mysql_async. The
    /// fence decides only on answers that carry a random number the statement just sent
    /// chose (the guarded `UPDATE`'s last-insert-id, a `SELECT`'s column), which an
    /// answer one behind never does: such a connection is refused with
    /// [`FenceError::ConnectionUnusable`] and flagged so that mysql_async's pool discards
    /// it when you drop it. Drop it (or call `Conn::disconnect`): the server rolls back
    /// when it closes, and until then the rows it locked stay locked.
    ///
    /// Passing the fence sets the session's `LAST_INSERT_ID()` to that random number.
    #[tracing::instrument(skip(self, conn), fields(table = self.table.sql(), token = %token))]
    pub async fn begin<'a>(
        &self,
        conn: &'a mut Conn,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'a>, FenceError> {
        self.begin_with(conn, TxOpts::default(), resource, token)
            .await
    }

    /// [`begin`](Self::begin) with transaction options, such as an isolation level.
    ///
    /// # Cancel safety
    ///
    /// As for [`begin`](Self::begin).
    #[tracing::instrument(skip(self, conn, options), fields(table = self.table.sql(), token = %token))]
    pub async fn begin_with<'a>(
        &self,
        conn: &'a mut Conn,
        options: TxOpts,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'a>, FenceError> {
        check_key(resource)?;
        usable(conn)?;
        if options.consistent_snapshot() {
            return Err(FenceError::UnsupportedOptions(
                "a consistent snapshot is taken before the fence row's lock is waited for, \
                 so the transaction would read data older than the previous holder's commit",
            ));
        }
        self.begin_checked(conn, options, resource, token).await
    }

    /// [`begin_with`](Self::begin_with) on a connection found usable.
    async fn begin_checked<'a>(
        &self,
        conn: &'a mut Conn,
        options: TxOpts,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'a>, FenceError> {
        let mut tx = conn.start_transaction(options).await?;
        let passed = match self.check(&mut tx, resource, token).await {
            // The mark that `commit` looks for: a savepoint lives exactly as long as the
            // transaction that took it.
            Ok(()) => tx.query_drop(MARK).await.map_err(FenceError::from),
            Err(err) => Err(err),
        };
        if let Err(err) = passed {
            if err.is_connection_unusable() {
                // A rollback would read someone else's answer; the connection is
                // condemned, and closing it rolls back.
                return Err(err);
            }
            // A server error carries no nonce: it may be an earlier statement's, read by
            // a lagging connection (which must not go back to a pool as it is).
            if matches!(err, FenceError::Database(mysql_async::Error::Server(_)))
                && !in_step(&mut tx).await
            {
                return Err(condemn(&mut tx));
            }
            // Free the fence row now rather than at the connection's next command.
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(%rollback, "rollback after a refused fence failed");
            }
            return Err(err);
        }
        Ok(FencedTransaction {
            tx,
            resource: resource.to_owned(),
            token,
        })
    }

    /// Passes the fence inside a transaction the caller already opened: moves the fence
    /// forward (and locks its row until the transaction ends) or returns
    /// [`FenceError::Stale`], after which the caller must roll back.
    ///
    /// Call it before the transaction's first plain `SELECT`: under REPEATABLE READ that
    /// read fixes the snapshot the transaction's later plain reads see, and a snapshot
    /// taken before the fence may miss the previous holder's write.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction open in an unknown state (the fence row
    /// may be locked or moved forward) and the connection owing an answer: drop the
    /// transaction and its connection, never commit it. (A fenced transaction's
    /// [`commit`](FencedTransaction::commit) refuses such a connection; mysql_async's own
    /// `Transaction::commit` does not.) Like [`begin`](Self::begin), it decides only on
    /// answers proven to be its own statements', and refuses a connection whose answers
    /// lag with [`FenceError::ConnectionUnusable`].
    #[tracing::instrument(skip(self, tx), fields(table = self.table.sql(), token = %token))]
    pub async fn check(
        &self,
        tx: &mut Transaction<'_>,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        check_key(resource)?;
        usable(tx)?;
        self.advance(tx, resource, token).await
    }

    /// [`check`](Self::check)'s statements, on a transaction found usable.
    async fn advance(
        &self,
        tx: &mut Transaction<'_>,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let value = Value::UInt(token.get());
        let key = Value::Bytes(resource.as_bytes().to_vec());
        let proof = nonce();
        tx.exec_drop(&self.lock_sql, vec![key.clone()]).await?;
        let advanced = done(
            &mut *tx,
            &self.advance_sql,
            vec![value.clone(), Value::UInt(proof), key.clone(), value],
        )
        .await?;
        // The server evaluates LAST_INSERT_ID(expr) only on a row the UPDATE matched, and
        // then reports expr as the OK packet's last-insert-id (MariaDB and MySQL alike,
        // with or without CLIENT_FOUND_ROWS: tests/mysql/abandoned_statement.rs checks
        // it); an UPDATE that matched nothing reports 0. Any other number is the answer
        // to an earlier statement: the connection lags.
        let matched = match (advanced.affected, advanced.insert_id) {
            (1, id) if id == proof => true,
            (0, 0) => false,
            _ => return Err(condemn(tx)),
        };
        if matched && advanced.warnings > 0 {
            // Outside strict SQL mode a token too large for the column is stored cut to
            // fit, with a warning (a table of the caller's with a narrow column). The
            // statement writes nothing else that could warn on the table `ensure_schema`
            // makes, so any warning is taken for that.
            return Err(FenceError::TokenOutOfRange {
                resource: resource.to_owned(),
                token,
                column: format!("{}.`token`", self.table.sql()),
            });
        }
        if matched {
            return Ok(());
        }
        // "0 rows, id 0" may be an earlier statement's answer too: the refusal is decided
        // on this read, whose answer carries a fresh nonce.
        let proof = nonce();
        let current: Option<Option<u64>> = proven_first(
            &mut *tx,
            &self.current_sql,
            vec![Value::UInt(proof), key],
            proof,
        )
        .await?;
        let Some(current) = current else {
            // No row carrying the nonce: an earlier statement's answer (the upsert made
            // the row in this transaction, so its own answer has one).
            return Err(condemn(tx));
        };
        Err(FenceError::Stale {
            resource: resource.to_owned(),
            presented: token,
            current: FencingToken::new(current.unwrap_or(0)),
        })
    }

    /// The newest token seen for `resource`, if any (a plain read: outside a
    /// transaction, the latest committed value). Its answer carries a random number the
    /// query chose, so a connection whose answers lag is refused
    /// ([`FenceError::ConnectionUnusable`]) instead of answered with another
    /// statement's result.
    #[tracing::instrument(skip(self, conn), fields(table = self.table.sql()))]
    pub async fn current(
        &self,
        conn: &mut impl Queryable,
        resource: &str,
    ) -> Result<Option<FencingToken>, FenceError> {
        let proof = nonce();
        let key = Value::Bytes(resource.as_bytes().to_vec());
        let row: Option<Option<u64>> =
            proven_first(conn, &self.read_sql, vec![key, Value::UInt(proof)], proof).await?;
        match row {
            Some(token) => Ok(token.map(FencingToken::new)),
            None => Err(condemn_queryable(conn)),
        }
    }
}

/// The savepoint a fenced transaction takes once it has passed the fence, and releases
/// just before `COMMIT`. The server can end a transaction without the client noticing: a
/// deadlock rolls it back (and frees the fence row), a statement that commits implicitly
/// (DDL, `LOCK TABLES`, `SET autocommit = 1`, ...) commits it; every statement after that
/// runs outside it (autocommitted, unfenced; or, with `autocommit = 0`, in a new
/// transaction of its own). A savepoint is gone with its transaction, so a `RELEASE` that
/// fails with [`ER_SP_DOES_NOT_EXIST`] says the transaction `COMMIT` would end is not
/// the fenced one. (`@@in_transaction` would not tell a new transaction from the fenced
/// one, and MySQL has no such variable.)
const MARK: &str = "SAVEPOINT fencelock_fenced";
const RELEASE_MARK: &str = "RELEASE SAVEPOINT fencelock_fenced";
/// `RELEASE_MARK` and a `SELECT` of a nonce, sent as one query: the server runs the
/// `SELECT` only if the release succeeded (it stops a multi-statement query at the first
/// error), and its row proves the answer is this query's. mysql_async asks for
/// `CLIENT_MULTI_STATEMENTS` on every connection.
fn release_proven(nonce: u64) -> String {
    format!("{RELEASE_MARK}; SELECT {nonce}")
}
/// The largest token a signed `BIGINT` holds: 2^63 - 1.
const SIGNED_BIGINT_MAX: u64 = u64::MAX >> 1;
/// "SAVEPOINT ... does not exist", MariaDB and MySQL.
const ER_SP_DOES_NOT_EXIST: u16 = 1305;
/// The answers to a `COMMIT` that say it was rolled back: a deadlock (1213; also Galera's
/// certification failure, decided alike on every node), a lock wait timeout (1205: a
/// commit that waited for the commit lock, then rolled back), MariaDB's
/// snapshot-isolation conflict (1020). Any other error in its place does not say whether
/// it committed: the session killed (1927, 3169), the server shutting down (1053), the
/// statement interrupted (1317) or timed out (1969); an error during the commit (1180:
/// raised also by the engine's commit step after the transaction reached the binary
/// log, which replicas and crash recovery then commit); Group Replication's rollback
/// (3101: also sent when the member leaves the group while the majority may commit the
/// transaction). A list of the errors known to roll back, not of those known not to, so
/// that one not foreseen is reported as unknown, never as "not committed".
const ROLLED_BACK: [u16; 3] = [1213, 1205, 1020];

/// A transaction that passed the fence. Use it like a [`Transaction`] (it derefs to one:
/// `exec_drop`, `query`, ... through [`Queryable`]), then [`commit`](Self::commit);
/// dropping it rolls back.
#[must_use = "dropping a fenced transaction rolls it back"]
pub struct FencedTransaction<'a> {
    tx: Transaction<'a>,
    resource: String,
    token: FencingToken,
}

impl std::fmt::Debug for FencedTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("resource", &self.resource)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<'a> Deref for FencedTransaction<'a> {
    type Target = Transaction<'a>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for FencedTransaction<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl FencedTransaction<'_> {
    /// The token this transaction was fenced with.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Commits the fence and the caller's statements together, if the server still runs
    /// the transaction that passed the fence: one that the server ended in between (a
    /// deadlock rolled it back; a statement such as `CREATE TABLE` committed it
    /// implicitly) is not committed, and the answer is [`FenceError::TransactionEnded`].
    /// Statements of yours that ran after that point ran unfenced, outside it (with
    /// `autocommit = 1`, each committed on its own: that cannot be undone; with
    /// `autocommit = 0`, in a new transaction, which is rolled back). If no answer comes
    /// to the `COMMIT` (the connection fails, the session is killed), the transaction may
    /// have been committed: the answer is [`FenceError::CommitUnknown`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: once `COMMIT` is sent, dropping the future leaves its outcome
    /// unknown (it may have committed). If a statement on this transaction was abandoned
    /// before its answer came (yours, even with other commands after it), `COMMIT` is
    /// not sent and the answer is [`FenceError::ConnectionUnusable`]: the check before it
    /// is decided on an answer that proves it is its own. Drop the connection, which
    /// rolls back.
    #[tracing::instrument(skip(self), fields(resource = %self.resource, token = %self.token))]
    pub async fn commit(mut self) -> Result<(), FenceError> {
        usable(&self.tx)?;
        let proof = nonce();
        let ended = match released(&mut self.tx, proof).await {
            Ok(true) => None,
            Ok(false) => return Err(condemn(&mut self.tx)),
            Err(mysql_async::Error::Server(server)) => {
                // An error carries no nonce: one read from a lagging answer ("no such
                // savepoint" of another transaction) is not this transaction's.
                if !in_step(&mut self.tx).await {
                    return Err(condemn(&mut self.tx));
                }
                Some(if server.code == ER_SP_DOES_NOT_EXIST {
                    FenceError::TransactionEnded {
                        resource: self.resource.clone(),
                    }
                } else {
                    mysql_async::Error::Server(server).into()
                })
            }
            Err(err) => Some(err.into()),
        };
        if let Some(err) = ended {
            // Whatever runs now is not the fenced transaction: never commit it.
            if let Err(rollback) = self.tx.rollback().await {
                tracing::debug!(%rollback, "rollback after a failed release of the mark failed");
            }
            return Err(err);
        }
        let resource = self.resource.clone();
        match self.tx.commit().await {
            Ok(()) => Ok(()),
            Err(mysql_async::Error::Server(server)) if ROLLED_BACK.contains(&server.code) => {
                Err(mysql_async::Error::Server(server).into())
            }
            // No answer to the `COMMIT`, the session's end in its place, or an error not
            // known to mean a rollback: the server may have committed it (a session
            // killed, or a statement time limit hit, while its commit waited for a
            // semi-synchronous replica had committed it already).
            Err(source) => Err(FenceError::CommitUnknown { resource, source }),
        }
    }

    /// Rolls everything back.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the connection owing an answer (later fence calls on it
    /// are refused): drop the connection, the server rolls back when it closes.
    pub async fn rollback(self) -> Result<(), FenceError> {
        usable(&self.tx)?;
        Ok(self.tx.rollback().await?)
    }
}

/// Sends [`release_proven`]: `Ok(true)` when the savepoint was released and the answer
/// carried `nonce`, `Ok(false)` when the answer was another statement's.
async fn released(tx: &mut Transaction<'_>, nonce: u64) -> Result<bool, mysql_async::Error> {
    let mut answer = tx.query_iter(release_proven(nonce)).await?;
    // The first result is the release's OK; the second the SELECT's one row.
    let _release: Vec<Row> = answer.collect().await?;
    let selected: Vec<Row> = answer.collect().await?;
    answer.drop_result().await?;
    let carried = match selected.as_slice() {
        [row] if row.len() == 1 => row
            .as_ref(0)
            .cloned()
            .and_then(|v| mysql_async::from_value_opt::<u64>(v).ok()),
        _ => None,
    };
    Ok(carried == Some(nonce))
}
