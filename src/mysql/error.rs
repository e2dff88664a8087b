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

    /// The database failed (connection lost, SQL error, deadlock, ...). The transaction
    /// was not committed.
    #[error("database error: {0}")]
    Database(#[from] mysql_async::Error),
}

/// InnoDB's "Deadlock found when trying to get lock": the whole transaction was rolled
/// back.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// InnoDB's "Lock wait timeout exceeded": the statement was rolled back.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

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

    /// The row the write was meant for does not exist.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// InnoDB gave up on a lock (a deadlock, or `innodb_lock_wait_timeout`): nothing was
    /// committed, and running the whole transaction again may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Database(mysql_async::Error::Server(server))
                if server.code == ER_LOCK_DEADLOCK || server.code == ER_LOCK_WAIT_TIMEOUT
        )
    }
}
