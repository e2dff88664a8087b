//! One remote etcd call: bounded by the request timeout, its error mapped to [`LockError`].

use std::future::Future;
use std::time::Duration;

use tonic::Code;

use crate::{Backend, LockError};

/// Runs `request` for at most `timeout`, mapping failures to typed errors.
///
/// Timeouts are enforced here rather than with tonic's per-request timeout, because that
/// one is also sent to the server as a gRPC deadline and would cut long-lived watch and
/// keep-alive streams.
pub(crate) async fn call<T>(
    operation: &'static str,
    lock: Option<&str>,
    timeout: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(map_error(operation, lock, err)),
        Err(_) => Err(LockError::Timeout {
            backend: Backend::Etcd,
            operation,
            lock: lock.map(str::to_owned),
            after: timeout,
        }),
    }
}

/// Sorts an etcd client error into the kinds callers branch on.
pub(crate) fn map_error(
    operation: &'static str,
    lock: Option<&str>,
    err: etcd_client::Error,
) -> LockError {
    use etcd_client::Error as E;
    let lock = lock.map(str::to_owned);
    let kind = match &err {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                Kind::Unavailable
            }
            Code::PermissionDenied | Code::Unauthenticated => Kind::Denied(status.message()),
            // etcd answers a wrong user or password with InvalidArgument.
            Code::InvalidArgument if status.message().contains("authentication failed") => {
                Kind::Denied(status.message())
            }
            _ => Kind::Other,
        },
        E::TransportError(_) | E::IoError(_) => Kind::Unavailable,
        E::InvalidUri(_) | E::InvalidArgs(_) | E::EndpointError(_) => {
            return LockError::InvalidConfig {
                backend: Backend::Etcd,
                reason: err.to_string(),
            };
        }
        _ => Kind::Other,
    };
    match kind {
        Kind::Unavailable => LockError::Unavailable {
            backend: Backend::Etcd,
            operation,
            lock,
            source: Box::new(err),
        },
        Kind::Denied(message) => LockError::PermissionDenied {
            backend: Backend::Etcd,
            operation,
            lock,
            message: message.to_owned(),
        },
        Kind::Other => LockError::Backend {
            backend: Backend::Etcd,
            operation,
            lock,
            source: Box::new(err),
        },
    }
}

enum Kind<'a> {
    Unavailable,
    Denied(&'a str),
    Other,
}

/// A response that lacks a field etcd always sends: a protocol error, not a panic.
pub(crate) fn malformed(operation: &'static str, lock: Option<&str>, what: &str) -> LockError {
    LockError::Backend {
        backend: Backend::Etcd,
        operation,
        lock: lock.map(str::to_owned),
        source: format!("malformed response: {what}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_status_codes() {
        let unavailable = map_error(
            "acquire",
            Some("x"),
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader")),
        );
        assert!(unavailable.is_unavailable());
        let denied = map_error(
            "connect",
            None,
            etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            )),
        );
        assert!(denied.is_permission_denied());
        let other = map_error(
            "acquire",
            None,
            etcd_client::Error::GRpcStatus(tonic::Status::internal("boom")),
        );
        assert!(matches!(other, LockError::Backend { .. }));
    }

    #[tokio::test]
    async fn times_out_with_the_operation_name() {
        let err = call(
            "release",
            Some("orders"),
            Duration::from_millis(10),
            std::future::pending::<Result<(), etcd_client::Error>>(),
        )
        .await
        .expect_err("must time out");
        assert!(err.is_timeout());
        assert!(err.to_string().contains("release on lock \"orders\""));
    }
}
