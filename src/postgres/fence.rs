//! The fence store: one row per resource holding the newest token seen, and writes that
//! apply only with a token at least that new.

use std::ops::Deref;

use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Transaction};

use super::FenceError;
use super::ident::Ident;
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

/// Fenced writes in PostgreSQL.
///
/// ```no_run
/// use fencelock::postgres::Fence;
/// use fencelock::FencingToken;
///
/// # async fn run(client: &mut tokio_postgres::Client) -> Result<(), fencelock::postgres::FenceError> {
/// let fence = Fence::new();
/// fence.ensure_schema(&*client).await?; // once, at deploy or start-up
///
/// let token = FencingToken::new(42); // from the lock guard
/// let tx = fence.begin(client, "inventory:sku-1", token).await?;
/// tx.execute("UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-1'", &[])
///     .await?;
/// tx.commit().await?; // or a FenceError::Stale before anything ran
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Fence {
    table: Ident,
    mode: FenceMode,
    advance_sql: String,
}

impl Default for Fence {
    fn default() -> Self {
        Self::new()
    }
}

impl Fence {
    /// Fences in table `public.fencelock_fences`, accepting equal tokens. The name is
    /// schema-qualified so that every role finds the same table whatever its
    /// `search_path` (two fence tables would each accept the other's stale tokens).
    pub fn new() -> Self {
        Self::build(
            Ident::trusted("\"public\".\"fencelock_fences\""),
            FenceMode::AllowEqual,
        )
    }

    /// Fences in another table: `schema.name`, or `name` as each connection's
    /// `search_path` resolves it (safe only if every writer resolves it the same way).
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
        // One statement: insert the first token of a resource, or move the fence forward
        // if this token is new enough. ON CONFLICT locks the row either way, so the
        // caller's statements that follow run while no other writer can pass the fence.
        // It returns the transaction's id (assigned by this write), which `commit` checks.
        let advance_sql = format!(
            "INSERT INTO {t} AS f (resource, token) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() \
             WHERE f.token {cmp} EXCLUDED.token RETURNING txid_current()"
        );
        Self {
            table,
            mode,
            advance_sql,
        }
    }

    /// The mode in use.
    #[must_use]
    pub fn mode(&self) -> FenceMode {
        self.mode
    }

    /// Creates the fence table if it does not exist. Call it once (at deploy or start-up);
    /// writes never create schema implicitly.
    pub async fn ensure_schema(&self, client: &impl GenericClient) -> Result<(), FenceError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (\
               resource text PRIMARY KEY, \
               token bigint NOT NULL CHECK (token >= 0), \
               updated_at timestamptz NOT NULL DEFAULT now())",
            self.table.sql()
        );
        client.batch_execute(&sql).await?;
        Ok(())
    }

    /// Begins a transaction that has passed the fence for `resource` with `token`: run
    /// the protected statements on it, then [`commit`](FencedTransaction::commit). A stale
    /// token returns [`FenceError::Stale`] and the transaction is rolled back.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future or the returned transaction rolls back; nothing is applied.
    #[tracing::instrument(skip(self, client), fields(table = self.table.sql()))]
    pub async fn begin<'a>(
        &self,
        client: &'a mut Client,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'a>, FenceError> {
        let tx = client.transaction().await?;
        let xid = self.advance(&tx, resource, token).await?;
        Ok(FencedTransaction {
            tx,
            resource: resource.to_owned(),
            token,
            xid,
        })
    }

    /// Passes the fence inside a transaction the caller already opened: moves the fence
    /// forward (and locks its row until the transaction ends) or returns
    /// [`FenceError::Stale`], after which the caller must roll back.
    ///
    /// Call it before the transaction reads what it will write. A read before the fence
    /// may see the data from before the previous holder's write, which that holder had
    /// not committed yet (it held the fence row; this call waits for it): under READ
    /// COMMITTED the write computed from that read overwrites the previous holder's (a
    /// lost update, tokens in order); under REPEATABLE READ the snapshot the read took
    /// makes the fence fail with a serialization error (40001).
    pub async fn check(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        self.advance(tx, resource, token).await.map(drop)
    }

    /// Passes the fence; returns the transaction's id.
    async fn advance(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        token: FencingToken,
    ) -> Result<i64, FenceError> {
        let value = to_bigint(token)?;
        let advanced = tx
            .query_typed_opt(
                &self.advance_sql,
                &[(&resource, Type::TEXT), (&value, Type::INT8)],
            )
            .await?;
        if let Some(row) = advanced {
            return Ok(row.try_get(0)?);
        }
        let current = self
            .current_in(tx, resource)
            .await?
            .unwrap_or(FencingToken::new(0));
        Err(FenceError::Stale {
            resource: resource.to_owned(),
            presented: token,
            current,
        })
    }

    /// The newest token seen for `resource`, if any.
    pub async fn current(
        &self,
        client: &impl GenericClient,
        resource: &str,
    ) -> Result<Option<FencingToken>, FenceError> {
        self.current_in(client, resource).await
    }

    /// What became of the fenced transaction `xid` whose `commit` went unanswered
    /// ([`FenceError::CommitUnknown`]): PostgreSQL's `txid_status` (10 and later), asked
    /// on any connection to the same server (the lost one is gone), the primary that ran
    /// it: not a standby promoted since (an asynchronous one may never have received the
    /// transaction, and may have given its id to another), nor a lagging replica. Read it
    /// before running the transaction again: [`Committed`](CommitStatus::Committed)
    /// means it was applied. [`InProgress`](CommitStatus::InProgress) may last as long
    /// as the server takes to notice the lost connection (its TCP keepalive; fencelock's
    /// advisory locks tune their own connections, not yours), holding the fence row
    /// locked meanwhile: ask again, or end that session.
    pub async fn commit_status(
        &self,
        client: &impl GenericClient,
        xid: i64,
    ) -> Result<CommitStatus, FenceError> {
        let row = client.query_one("SELECT txid_status($1)", &[&xid]).await?;
        Ok(match row.try_get::<_, Option<&str>>(0)? {
            Some("committed") => CommitStatus::Committed,
            Some("in progress") => CommitStatus::InProgress,
            Some(_) => CommitStatus::Aborted,
            None => CommitStatus::Forgotten,
        })
    }

    async fn current_in(
        &self,
        client: &impl GenericClient,
        resource: &str,
    ) -> Result<Option<FencingToken>, FenceError> {
        let sql = format!("SELECT token FROM {} WHERE resource = $1", self.table.sql());
        let row = client.query_opt(&sql, &[&resource]).await?;
        Ok(row
            .map(|r| r.try_get::<_, i64>(0))
            .transpose()?
            .map(|t| FencingToken::new(u64::try_from(t).unwrap_or(0))))
    }
}

/// A token as PostgreSQL's `bigint`.
pub(crate) fn to_bigint(token: FencingToken) -> Result<i64, FenceError> {
    i64::try_from(token.get()).map_err(|_| FenceError::TokenOutOfRange(token))
}

/// A transaction that passed the fence. Use it like a [`Transaction`] (it derefs to one),
/// then [`commit`](Self::commit); dropping it rolls back.
#[must_use = "dropping a fenced transaction rolls it back"]
pub struct FencedTransaction<'a> {
    tx: Transaction<'a>,
    resource: String,
    token: FencingToken,
    /// The id of the transaction that passed the fence (`txid_current()`).
    xid: i64,
}

/// Whether `err` is the server's answer to the statement (an `ERROR`: it failed, and
/// changed nothing that a `COMMIT` after it could commit), rather than the end of the
/// connection or of the session (`FATAL`, `PANIC`) in its place. Read from the severity
/// field that is never translated (`V`, sent since PostgreSQL 9.6): an error without it
/// (an older server, a pooler's own error such as PgBouncer's `query_timeout`) counts as
/// no answer, which is right for a pooler's, and on the safe side for the rest.
fn answered(err: &tokio_postgres::Error) -> bool {
    err.as_db_error()
        .is_some_and(|db| db.parsed_severity() == Some(Severity::Error))
}

/// What became of a transaction whose `commit` went unanswered
/// ([`FenceError::CommitUnknown`]), as [`Fence::commit_status`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitStatus {
    /// Committed: the fence and the writes were applied together.
    Committed,
    /// Rolled back, or never committed (a crash): nothing was applied.
    Aborted,
    /// Still running on the server (its session is alive, the connection to it lost):
    /// ask again later; the server ends it when it notices the connection's loss.
    InProgress,
    /// Too old for the server to say (its commit log was truncated since).
    Forgotten,
}

/// Sent just before `COMMIT`, in the same round trip: fails unless the transaction `COMMIT`
/// will end is the one that passed the fence. In a transaction an error aborted, it fails
/// like every statement there (25P02), and `COMMIT` is answered `ROLLBACK`; in another one
/// (the fenced one was ended by a `COMMIT` or `ROLLBACK` of the caller's, and a new one
/// begun) or none, the id differs and it divides by zero (22012), which aborts a new
/// transaction, so that `COMMIT` rolls that back too. (The division is by a volatile
/// value, so the planner cannot fold it into an error of its own.)
const STILL_FENCED: &str = "SELECT 1 / (txid_current_if_assigned() IS NOT DISTINCT FROM $1)::int";

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

impl FencedTransaction<'_> {
    /// The token this transaction was fenced with.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Commits the fence and the caller's statements together, if the transaction is
    /// still the one that passed the fence: one that an error aborted (its `COMMIT` is
    /// answered `ROLLBACK`, which tokio-postgres reports as success), or that a `COMMIT` or
    /// `ROLLBACK` of yours ended, is not committed, and the answer is
    /// [`FenceError::TransactionEnded`]. The check costs no round trip: it is sent with
    /// the `COMMIT`. If no answer comes (the connection fails, the session is ended),
    /// the transaction may have been committed: the answer is
    /// [`FenceError::CommitUnknown`], and [`Fence::commit_status`] tells which.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: once `COMMIT` is sent, dropping the future leaves its outcome
    /// unknown.
    pub async fn commit(self) -> Result<(), FenceError> {
        let Self {
            tx, resource, xid, ..
        } = self;
        // Both are queued before either is answered (tokio-postgres pipelines what is
        // polled together), the check first. `Transaction::commit` would move `tx`.
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&xid, Type::INT8)];
        let (checked, committed) = tokio::join!(
            tx.query_typed_one(STILL_FENCED, &params),
            tx.batch_execute("COMMIT"),
        );
        // Whatever the answers, the server has ended the transaction: no ROLLBACK from
        // the handle's drop (it would only earn a warning). A top-level transaction owns
        // no allocation, so nothing leaks.
        std::mem::forget(tx);
        // An `ERROR` answer is the server's word: the statement failed, the transaction
        // is aborted, and the `COMMIT` after it can only roll back. Anything else (the
        // connection closed, a `FATAL` that ended the session) came instead of an answer:
        // the server may have run the `COMMIT` (a session ended while its commit waited
        // for a synchronous standby had committed locally), so the outcome is unknown.
        let unknown = |source: tokio_postgres::Error| FenceError::CommitUnknown {
            resource: resource.clone(),
            xid,
            source,
        };
        if let Err(err) = checked {
            let aborted = err.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION);
            if aborted || err.code() == Some(&SqlState::DIVISION_BY_ZERO) {
                return Err(FenceError::TransactionEnded { resource, aborted });
            }
            if !answered(&err) {
                return Err(unknown(err));
            }
            return Err(err.into());
        }
        match committed {
            Ok(()) => Ok(()),
            Err(err) if answered(&err) => Err(err.into()),
            Err(err) => Err(unknown(err)),
        }
    }

    /// Rolls everything back.
    pub async fn rollback(self) -> Result<(), FenceError> {
        self.tx.rollback().await?;
        Ok(())
    }
}
