//! The storage error: what a fenced (or otherwise guarded) MariaDB/MySQL write found.

use crate::FencingToken;

/// Why a fenced (or otherwise guarded) write was not applied.
///
/// Matching on the variants is possible, but the predicates ([`is_stale`](Self::is_stale),
/// [`is_conflict`](Self::is_conflict), ...) are the stable way to branch: new variants
/// may be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The presented token is older than one the storage has already seen: a newer
    /// holder exists, and nothing of this write was applied.
    #[error("stale fencing token {presented} for {resource:?}: storage has seen {current}")]
    Stale {
        /// The protected resource.
        resource: String,
        /// The token this write carried.
        presented: FencingToken,
        /// The newest token the storage has seen.
        current: FencingToken,
    },

    /// The row the write was meant for does not exist.
    #[error("no row for {resource:?}")]
    NotFound {
        /// The resource (key) looked for.
        resource: String,
    },

    /// An optimistic compare-and-set found another version than expected.
    #[error("version conflict on {resource:?}: expected {expected}, found {current:?}")]
    VersionConflict {
        /// The resource (key).
        resource: String,
        /// The version the caller read.
        expected: i64,
        /// The version stored now (`None` if the row is gone).
        current: Option<i64>,
    },

    /// The token does not fit the column that would store it: outside strict SQL mode
    /// the server would cut it to the column's largest value, and every later token above
    /// that, stale or not, would pass. Nothing was written.
    #[error(
        "fencing token {token} for {resource:?} does not fit the token column {column}: \
         use BIGINT UNSIGNED"
    )]
    TokenOutOfRange {
        /// The protected resource.
        resource: String,
        /// The token presented.
        token: FencingToken,
        /// The column, and what it is declared as where known.
        column: String,
    },

    /// A token column that `information_schema` does not list where the write would go
    /// (a `TEMPORARY` table, a table or column not created yet, or one the user may not
    /// see): its capacity cannot be checked, so nothing was written.
    #[error(
        "the token column {column} is not in information_schema (a TEMPORARY table, or not \
         created yet): its capacity cannot be checked, so nothing was written"
    )]
    UnknownTokenColumn {
        /// The column, and the database looked in.
        column: String,
    },

    /// A token column (of an existing fence table) that cannot hold every token.
    #[error(
        "the token column {column} is {column_type}: it must hold any token below 2^63 (BIGINT, best BIGINT UNSIGNED)"
    )]
    NarrowTokenColumn {
        /// The column.
        column: String,
        /// Its declared type.
        column_type: String,
    },

    /// A table or column name that is not a plain SQL identifier.
    #[error(
        "invalid SQL identifier {0:?}: use ASCII letters, digits and '_' (not starting with \
         a digit, at most 64 bytes), optionally database-qualified"
    )]
    InvalidIdentifier(String),

    /// A resource name or idempotency key the helper's table cannot store exactly (empty,
    /// or longer than its `VARBINARY` column).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Transaction options the fence cannot keep its promise under: with a consistent
    /// snapshot (`START TRANSACTION WITH CONSISTENT SNAPSHOT`) the read view is fixed
    /// before the fence row's lock is waited for, so the transaction would read data older
    /// than the previous holder's commit and could overwrite it (a lost update with tokens
    /// in order).
    #[error("unsupported transaction options: {0}")]
    UnsupportedOptions(&'static str),

    /// The connection may still owe the answer to a statement whose future was dropped
    /// (a caller's timeout, a cancelled task): mysql_async would hand that answer to the
    /// next command, and every later answer would be one behind, so a refused fence could
    /// read as passed. Nothing was sent on it but, on a connection a fence call gave up
    /// on, a query whose answer would have shown it in step. Drop the connection (closing it rolls back
    /// whatever it left open) and use a new one.
    #[error(
        "the connection was abandoned in the middle of a statement (a dropped future) and may \
         still owe its answer: drop it and connect again"
    )]
    ConnectionUnusable,

    /// The server ended the fenced transaction before `commit` (a deadlock rolled it
    /// back, or a statement such as DDL committed it implicitly): nothing was committed
    /// by `commit`. Statements run after that point ran outside the fence; with
    /// `autocommit = 1` each of them was committed on its own.
    #[error(
        "the fenced transaction for {resource:?} had already ended on the server (rolled \
         back by a deadlock, or committed implicitly by a statement such as DDL); \
         statements after that ran unfenced, and nothing more was committed"
    )]
    TransactionEnded {
        /// The protected resource.
        resource: String,
    },

    /// `commit` sent `COMMIT`, and no answer says what became of it: the connection
    /// failed, or the session was killed or the server shut down in its place (any error
    /// but those known to mean a rollback: a deadlock, a lock wait timeout, a snapshot
    /// conflict). The
    /// transaction may have been committed, fence and writes together, or not at all. Do
    /// not run it again as if it had failed: with a fence that accepts equal tokens the
    /// retry would pass and apply the writes twice (a strict fence would refuse it as
    /// stale, its own first attempt's token). Find out first: read back what the
    /// transaction wrote, or make its work idempotent
    /// ([`IdempotencyKeys`](super::IdempotencyKeys), claimed inside it).
    #[error(
        "the outcome of the fenced transaction for {resource:?} is unknown: COMMIT was \
         sent and no answer came ({source}); it may have been committed"
    )]
    CommitUnknown {
        /// The protected resource.
        resource: String,
        /// What came instead of the answer.
        #[source]
        source: mysql_async::Error,
    },

    /// The database failed (SQL error, deadlock, connection lost, ...). What was sent
    /// with it was not applied, except where the database could not say: a statement
    /// sent in autocommit mode whose connection failed before its answer may have been
    /// applied, as with any statement; a fenced transaction's `commit` says so itself
    /// ([`CommitUnknown`](Self::CommitUnknown)).
    #[error("database error: {0}")]
    Database(#[from] mysql_async::Error),
}

/// InnoDB's "Deadlock found when trying to get lock": the whole transaction was rolled
/// back.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// InnoDB's "Lock wait timeout exceeded": the statement was rolled back.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB's "Record has changed since last read" (`innodb_snapshot_isolation`, the
/// default from MariaDB 11.8): the transaction must be run again.
const ER_CHECKREAD: u16 = 1020;
/// MySQL's "Statement aborted because lock(s) could not be acquired immediately and
/// NOWAIT is set".
const ER_LOCK_NOWAIT: u16 = 3572;
/// MariaDB's "Query execution was interrupted (max_statement_time exceeded)".
const ER_STATEMENT_TIMEOUT: u16 = 1969;
/// MySQL's "Query execution was interrupted, maximum statement execution time exceeded".
const ER_QUERY_TIMEOUT: u16 = 3024;
/// The server errors after which the whole transaction may succeed when run again.
const RETRYABLE: [u16; 6] = [
    ER_LOCK_DEADLOCK,
    ER_LOCK_WAIT_TIMEOUT,
    ER_CHECKREAD,
    ER_LOCK_NOWAIT,
    ER_STATEMENT_TIMEOUT,
    ER_QUERY_TIMEOUT,
];

impl FenceError {
    /// The write was refused because a newer token was seen (the fence worked).
    #[must_use]
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    /// An optimistic compare-and-set lost the race.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::VersionConflict { .. })
    }

    /// The connection was abandoned mid-statement and is refused
    /// ([`ConnectionUnusable`](Self::ConnectionUnusable)): drop it, and run the whole
    /// transaction again on a new one.
    #[must_use]
    pub fn is_connection_unusable(&self) -> bool {
        matches!(self, Self::ConnectionUnusable)
    }

    /// `commit` found that the server had ended the fenced transaction already
    /// ([`TransactionEnded`](Self::TransactionEnded)).
    #[must_use]
    pub fn is_transaction_ended(&self) -> bool {
        matches!(self, Self::TransactionEnded { .. })
    }

    /// `commit` got no answer to its `COMMIT`: the transaction may have been committed
    /// ([`CommitUnknown`](Self::CommitUnknown)). Find out before running it again.
    #[must_use]
    pub fn is_commit_unknown(&self) -> bool {
        matches!(self, Self::CommitUnknown { .. })
    }

    /// The row the write was meant for does not exist.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// The server gave up on the transaction or a statement of it (a deadlock,
    /// `innodb_lock_wait_timeout`, MariaDB's snapshot-isolation conflict 1020, MySQL's
    /// `NOWAIT`, a statement time limit): roll back and run the whole transaction again,
    /// from `begin`: it may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Database(mysql_async::Error::Server(server)) if RETRYABLE.contains(&server.code)
        )
    }
}
