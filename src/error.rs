//! The lock error: what went wrong, where, and to which lock.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::loss::LossReason;

/// A boxed error from a client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Which lock service an error comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// etcd, through its v3 gRPC API.
    Etcd,
    /// A single Redis instance (or a master with replicas).
    Redis,
    /// Redlock over several independent Redis masters.
    Redlock,
    /// PostgreSQL advisory locks.
    Postgres,
    /// MariaDB or MySQL (fenced storage only; no lock backend).
    MySql,
    /// A ZooKeeper ensemble.
    ZooKeeper,
}

impl Backend {
    /// The backend's name: `etcd`, `redis`, `redlock`, `postgres`, `mysql` or `zookeeper`
    /// (also its `backend` label in [`crate::metrics`]).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::ZooKeeper => "zookeeper",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong while taking, holding or releasing a lock.
///
/// Matching on the variants is possible, but the predicates (`is_timeout()`,
/// `is_unavailable()`, ...) are the stable way to branch: new variants may be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock name cannot be used (empty, too long, or a character outside the allowed set).
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A lock option is out of range (for example a zero or sub-second TTL for etcd).
    #[error("invalid lock option `{option}`: {reason}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong with its value.
        reason: String,
    },

    /// The connection settings are unusable (no endpoints, a malformed endpoint, ...).
    #[error("invalid {backend} configuration: {reason}")]
    InvalidConfig {
        /// The backend being configured.
        backend: Backend,
        /// What is wrong.
        reason: String,
    },

    /// The lock stayed taken for the whole wait timeout; nothing was left behind.
    #[error("gave up waiting for lock {name:?} after {waited:?}")]
    WaitTimeout {
        /// The lock.
        name: String,
        /// The wait timeout that ran out.
        waited: Duration,
    },

    /// A request got no answer within the configured request (or connect) timeout.
    #[error("{backend} did not answer {operation}{} within {after:?}", on_lock(.lock))]
    Timeout {
        /// The backend.
        backend: Backend,
        /// The remote operation that timed out.
        operation: &'static str,
        /// The lock it was for, if any.
        lock: Option<String>,
        /// The timeout.
        after: Duration,
    },

    /// The server could not be reached, or the connection broke during the operation.
    #[error("{backend} unreachable during {operation}{}: {source}", on_lock(.lock))]
    Unavailable {
        /// The backend.
        backend: Backend,
        /// The remote operation.
        operation: &'static str,
        /// The lock it was for, if any.
        lock: Option<String>,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// The server refused the credentials or the operation.
    #[error("{backend} refused {operation}{}: permission denied ({message})", on_lock(.lock))]
    PermissionDenied {
        /// The backend.
        backend: Backend,
        /// The remote operation.
        operation: &'static str,
        /// The lock it was for, if any.
        lock: Option<String>,
        /// The server's message.
        message: String,
    },

    /// A TLS handshake failed: the server's certificate is not trusted (unknown CA,
    /// expired, issued for another name), the server requires a client certificate it did
    /// not get or does not trust, or one side does not speak TLS. Retrying does not help;
    /// the message says what to change. (Unreadable or malformed certificate and key files
    /// are [`InvalidConfig`](Self::InvalidConfig), with the path.)
    #[error("{backend} TLS failure during {operation}: {reason}")]
    Tls {
        /// The backend.
        backend: Backend,
        /// The remote operation.
        operation: &'static str,
        /// What failed, in words a person can act on.
        reason: String,
    },

    /// The server is configured in a way that breaks the lock or its token, so the client
    /// refused to use it: for Redis, a `maxmemory-policy` that may evict keys (the lock
    /// key, then two clients hold the lock; or the token counter, then tokens go
    /// backwards). The message says what to change, and how to opt out.
    #[error("{backend} server {address} is unsafe for locks: {reason}")]
    UnsafeServer {
        /// The backend.
        backend: Backend,
        /// The server, as `host:port`.
        address: String,
        /// What is wrong and what to do about it.
        reason: String,
    },

    /// The lock's name is in use by another client's recipe that keeps its holders where
    /// this lock cannot see them and does not see this lock's nodes (on ZooKeeper:
    /// Curator's `InterProcessSemaphoreV2`, kazoo's `Semaphore`): both could hold at
    /// once, so nothing was taken. Use another name for one of them.
    #[error(
        "{backend} lock {lock:?} shares its path with {recipe}, which cannot exclude it: \
         use another lock name"
    )]
    IncompatibleRecipe {
        /// The backend.
        backend: Backend,
        /// The lock.
        lock: String,
        /// The other recipe, and what gave it away.
        recipe: &'static str,
    },

    /// The lease behind the lock (or behind a wait for it) is gone: ownership cannot be
    /// relied on any more.
    #[error("lease lost{}: {reason}", on_lock(.lock))]
    LeaseLost {
        /// The lock, if the loss happened during an operation on one.
        lock: Option<String>,
        /// Why the lease is considered gone.
        reason: LossReason,
    },

    /// An owner-guarded operation found that this guard no longer owns the lock.
    #[error("lock {name:?} is no longer held by this guard (token {token})")]
    NotHeld {
        /// The lock.
        name: String,
        /// The guard's token.
        token: crate::FencingToken,
    },

    /// Any other failure reported by the backend.
    #[error("{backend} failed during {operation}{}: {source}", on_lock(.lock))]
    Backend {
        /// The backend.
        backend: Backend,
        /// The remote operation.
        operation: &'static str,
        /// The lock it was for, if any.
        lock: Option<String>,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

fn on_lock(lock: &Option<String>) -> String {
    match lock {
        Some(name) => format!(" on lock {name:?}"),
        None => String::new(),
    }
}

impl LockError {
    /// A request timed out, or the wait for the lock did.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::WaitTimeout { .. })
    }

    /// The lock stayed taken for the whole wait timeout.
    #[must_use]
    pub fn is_wait_timeout(&self) -> bool {
        matches!(self, Self::WaitTimeout { .. })
    }

    /// The server could not be reached or did not answer in time.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout { .. })
    }

    /// Ownership is gone (lease lost, or the lock was found to belong to someone else).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::LeaseLost { .. } | Self::NotHeld { .. })
    }

    /// The caller's input was rejected before any lock operation was sent (a
    /// configuration may be refused once connected: two names of one Redlock master).
    #[must_use]
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::InvalidName { .. } | Self::InvalidOption { .. } | Self::InvalidConfig { .. }
        )
    }

    /// The server refused the credentials or the operation.
    #[must_use]
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Self::PermissionDenied { .. })
    }

    /// A TLS handshake failed (see [`LockError::Tls`]).
    #[must_use]
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }

    /// The server's configuration makes the lock unsafe (see [`LockError::UnsafeServer`]).
    #[must_use]
    pub fn is_unsafe_server(&self) -> bool {
        matches!(self, Self::UnsafeServer { .. })
    }

    /// The lock's name is taken by another client's recipe that cannot exclude it (see
    /// [`LockError::IncompatibleRecipe`]).
    #[must_use]
    pub fn is_incompatible_recipe(&self) -> bool {
        matches!(self, Self::IncompatibleRecipe { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_lock_and_the_operation() {
        let err = LockError::Timeout {
            backend: Backend::Etcd,
            operation: "acquire",
            lock: Some("orders".into()),
            after: Duration::from_millis(500),
        };
        assert_eq!(
            err.to_string(),
            "etcd did not answer acquire on lock \"orders\" within 500ms"
        );
        assert!(err.is_timeout() && err.is_unavailable() && !err.is_lost());

        let err = LockError::LeaseLost {
            lock: None,
            reason: LossReason::Revoked,
        };
        assert!(err.is_lost());
        assert!(err.to_string().starts_with("lease lost: "));
    }
}
