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

    /// The database failed (connection lost, SQL error, ...). The transaction was not
    /// committed.
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
}
