//! The storage error: what a fenced write found.

use crate::FencingToken;

/// Why a fenced (or otherwise guarded) write was not applied.
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

    /// A table or column name that is not a plain SQL identifier.
    #[error(
        "invalid SQL identifier {0:?}: use letters, digits and '_', optionally schema-qualified"
    )]
    InvalidIdentifier(String),

    /// A token too large for PostgreSQL's `bigint`.
    #[error("fencing token {0} does not fit in a bigint")]
    TokenOutOfRange(FencingToken),

    /// `commit` found the fenced transaction over already: an error had aborted it
    /// (`aborted`; PostgreSQL answers its `COMMIT` with `ROLLBACK`), or a `COMMIT` or
    /// `ROLLBACK` sent through it had ended it. Nothing was committed by `commit`;
    /// statements run after such an end ran outside the fence (each committed on its own).
    #[error(
        "the fenced transaction for {resource:?} was over before commit ({}); nothing was \
         committed by it",
        if *aborted { "an error had aborted it" } else { "a COMMIT or ROLLBACK through it had ended it" }
    )]
    TransactionEnded {
        /// The protected resource.
        resource: String,
        /// An error had aborted it (otherwise a `COMMIT` or `ROLLBACK` had ended it).
        aborted: bool,
    },

    /// `commit` sent `COMMIT`, and no answer says what became of it: the connection
    /// failed (or the session was ended) after the check and `COMMIT` were sent. The
    /// transaction may have been committed, fence and writes together, or not at all.
    /// Do not run it again as if it had failed: with a fence that accepts equal tokens
    /// the retry would pass and apply the writes twice (under
    /// [`FenceMode::Strict`](super::FenceMode::Strict) it would be refused as stale by
    /// the first attempt's own token). Ask the server with
    /// [`Fence::commit_status`](super::Fence::commit_status) and `xid`, on a new
    /// connection.
    #[error(
        "the outcome of the fenced transaction for {resource:?} (xid {xid}) is unknown: \
         COMMIT was sent and no answer came ({}); it may have been committed",
        describe(source)
    )]
    CommitUnknown {
        /// The protected resource.
        resource: String,
        /// The transaction's id (`txid_current()`), for
        /// [`Fence::commit_status`](super::Fence::commit_status).
        xid: i64,
        /// What ended the wait for the answer.
        #[source]
        source: tokio_postgres::Error,
    },

    /// The database failed (SQL error, connection lost, ...). What was sent with it was
    /// not applied, except where the database could not say: a statement sent in
    /// autocommit mode (a [`TokenColumn`](super::TokenColumn) or
    /// [`VersionColumn`](super::VersionColumn) write, an
    /// [`IdempotencyKeys`](super::IdempotencyKeys) claim) whose connection failed before
    /// its answer may have been applied, as with any statement; a fenced transaction's
    /// `commit` says so itself ([`CommitUnknown`](Self::CommitUnknown)).
    #[error("database error: {}", describe(.0))]
    Database(#[from] tokio_postgres::Error),
}

/// The server's own words where it sent some ("db error" alone says nothing).
fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => err.to_string(),
    }
}

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

    /// `commit` found the fenced transaction over already
    /// ([`TransactionEnded`](Self::TransactionEnded)).
    #[must_use]
    pub fn is_transaction_ended(&self) -> bool {
        matches!(self, Self::TransactionEnded { .. })
    }

    /// `commit` got no answer to its `COMMIT`: the transaction may have been committed
    /// ([`CommitUnknown`](Self::CommitUnknown)). Ask before running it again.
    #[must_use]
    pub fn is_commit_unknown(&self) -> bool {
        matches!(self, Self::CommitUnknown { .. })
    }
}
