//! The client library's errors, sorted into the crate's [`LockError`].

use std::time::Duration;

use zookeeper_client::Error as ZkError;

use crate::{Backend, LockError, LossReason};

/// What a failed request means for the lock it was for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RequestError {
    /// The server answered with an error, or the client failed before sending.
    #[error(transparent)]
    Server(#[from] ZkError),
    /// No answer within the request timeout (the request may still be applied).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl RequestError {
    /// Whether the request may have been applied although it failed: the connection broke
    /// or the answer did not come in time. A create with this outcome must be looked for
    /// (protected mode), not repeated.
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_)
                | Self::Server(ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))
        )
    }

    /// Whether the session (and with it every ephemeral node of it) is gone.
    pub(crate) fn session_gone(&self) -> Option<LossReason> {
        match self {
            Self::Server(ZkError::SessionExpired | ZkError::AuthFailed) => {
                Some(LossReason::Revoked)
            }
            Self::Server(ZkError::ClientClosed) => Some(LossReason::Closed),
            _ => None,
        }
    }

    /// The crate's error for this failure of `operation` on `lock`.
    pub(crate) fn into_lock_error(self, operation: &'static str, lock: Option<&str>) -> LockError {
        let lock = lock.map(str::to_owned);
        let backend = Backend::ZooKeeper;
        if let Some(reason) = self.session_gone() {
            return LockError::LeaseLost { lock, reason };
        }
        match self {
            Self::Timeout(after) => LockError::Timeout {
                backend,
                operation,
                lock,
                after,
            },
            // `Custom`: the client library's own failures of a connection ("no response
            // from connection", an I/O error), with which it fails the requests then in
            // flight (zookeeper-client 0.11's session loop); its other uses (SASL, read-only
            // sessions) are not features this crate turns on.
            Self::Server(
                err @ (ZkError::ConnectionLoss
                | ZkError::NoHosts
                | ZkError::Timeout
                | ZkError::Custom(_)),
            ) => LockError::Unavailable {
                backend,
                operation,
                lock,
                source: Box::new(err),
            },
            Self::Server(ZkError::NoAuth) => LockError::PermissionDenied {
                backend,
                operation,
                lock,
                message: "the node's ACL does not allow it".into(),
            },
            Self::Server(err) => LockError::Backend {
                backend,
                operation,
                lock,
                source: Box::new(err),
            },
        }
    }
}

/// Runs one request with the request timeout.
pub(crate) async fn timed<T>(
    timeout: Duration,
    request: impl std::future::Future<Output = Result<T, ZkError>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(answer) => answer.map_err(RequestError::Server),
        Err(_) => Err(RequestError::Timeout(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_the_client_errors() {
        let lost = RequestError::Server(ZkError::SessionExpired).into_lock_error("acquire", None);
        assert!(lost.is_lost(), "{lost}");
        let down = RequestError::Server(ZkError::ConnectionLoss);
        assert!(down.outcome_unknown());
        assert!(down.into_lock_error("acquire", Some("a")).is_unavailable());
        let slow = RequestError::Timeout(Duration::from_secs(1));
        assert!(slow.outcome_unknown());
        assert!(slow.into_lock_error("release", None).is_timeout());
        let denied = RequestError::Server(ZkError::NoAuth).into_lock_error("acquire", None);
        assert!(denied.is_permission_denied());
        assert!(!RequestError::Server(ZkError::NodeExists).outcome_unknown());
    }
}
