//! One remote etcd call: bounded by the request timeout, its error mapped to [`LockError`].

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use tonic::Code;

use super::token_renewal::{MAX_RENEWALS, TokenRenewal, is_old_auth_revision};
use crate::{Backend, LockError};

/// Runs `request` for at most `timeout`, mapping failures to typed errors.
///
/// Timeouts are enforced here rather than with tonic's per-request timeout, because that
/// one is also sent to the server as a gRPC deadline and would cut long-lived watch and
/// keep-alive streams.
///
/// A combinator, not an `async fn`: an `async fn` keeps its argument and the future made
/// from it side by side in its state (rust-lang/rust#62958), which doubled the size of
/// every etcd call (a transaction's 2 KiB future made a 5 KiB one) and of every future
/// holding one; a lock + release cycle spent more client CPU copying those futures from
/// frame to frame than in fencelock's own code (`examples/alloc_count.rs` under
/// callgrind).
pub(crate) fn call<'a, T, F>(
    operation: &'static str,
    lock: Option<&'a str>,
    timeout: Duration,
    request: F,
) -> impl Future<Output = Result<T, LockError>> + use<'a, T, F>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    tokio::time::timeout(timeout, request).map(move |answer| match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(map_error(operation, lock, err)),
        Err(_) => Err(LockError::Timeout {
            backend: Backend::Etcd,
            operation,
            lock: lock.map(str::to_owned),
            after: timeout,
        }),
    })
}

/// Like [`call`], but a request refused for a token older than etcd's auth store is sent
/// again once the client authenticated again (`token_renewal.rs`): that refusal proves it
/// was not applied, so this suits every request, a guarded write too. Nothing else is
/// retried. At worst `timeout` and, for each of at most [`MAX_RENEWALS`] renewals, two
/// more (authenticating, sending again).
pub(crate) async fn call_renewing<T, F, Fut>(
    operation: &'static str,
    lock: Option<&str>,
    timeout: Duration,
    renewal: &TokenRenewal,
    mut request: F,
) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut renewals = 0;
    loop {
        let seen = renewal.seen();
        match call(operation, lock, timeout, request()).await {
            Err(err) if renewals < MAX_RENEWALS && is_old_auth_revision(&err) => {
                renewals += 1;
                renewal.resend_after(err, seen, timeout).await?;
            }
            result => return result,
        }
    }
}

/// Like [`call`], but retries a request that found its member unreachable (connection
/// refused or reset: the client balances over every endpoint, so the next attempt may
/// reach a live member) until `timeout` has passed since the first attempt, and a request
/// that timed out once (a proposal dropped by a dying leader is never answered). A retry
/// after that timeout gets a window of its own: until `timeout` has passed since the
/// timeout, a retry that finds its member unreachable is retried too. (The leader dies
/// with a forwarded join in flight: the join times out after `timeout`, and its retry may
/// be balanced to the dead member's refused port before a member that would answer.
/// Without a window of its own that refusal ended the call, although a new leader had
/// long been elected: `tests/etcd/retry_after_timeout.rs`.) At worst a call takes four
/// times `timeout` plus half a second of pauses, and, for each of at most
/// [`MAX_RENEWALS`] refusals of an old auth token, one `timeout` more to authenticate
/// and one to send again (the time spent so counts against the window for unreachable
/// members).
///
/// Only for requests that are safe to apply twice: reads, deletes, revokes, transactions
/// guarded by a compare that an earlier attempt would make fail, and lease grants (a
/// duplicate grant leaves an unused lease that runs out).
///
/// A confirmed retry does **not** prove that an earlier attempt is dead: one that got no
/// answer may still be applied later (a proposal a follower forwarded to the leader is
/// applied whatever became of its client, `etcdserver/v3_server.go`). Callers whose
/// request must not land late use [`call_retrying_noting`]. A request refused for an old
/// auth token is sent again as [`call_renewing`] does.
pub(crate) async fn call_retrying<T, F, Fut>(
    operation: &'static str,
    lock: Option<&str>,
    timeout: Duration,
    renewal: &TokenRenewal,
    request: F,
) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    call_retrying_noting(operation, lock, timeout, renewal, request)
        .await
        .result
}

/// What [`call_retrying_noting`] found.
#[derive(Debug)]
pub(crate) struct Attempts<T> {
    /// The last attempt's outcome.
    pub(crate) result: Result<T, LockError>,
    /// Some attempt failed in a way that leaves its fate unknown: it may have been applied,
    /// or may still be applied later (see [`may_have_applied`]).
    pub(crate) ambiguous: bool,
}

/// [`call_retrying`], telling whether any attempt's outcome is unknown.
pub(crate) async fn call_retrying_noting<T, F, Fut>(
    operation: &'static str,
    lock: Option<&str>,
    timeout: Duration,
    renewal: &TokenRenewal,
    mut request: F,
) -> Attempts<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    // Until when a request that found its member unreachable is retried: `timeout` after
    // the first attempt, or after the one timeout that is retried.
    let mut retry_until = tokio::time::Instant::now() + timeout;
    // Attempts in all (for the log), and refusals in the current window (for the pause).
    let (mut attempt, mut refused): (u32, u32) = (0, 0);
    let mut timed_out = false;
    let mut ambiguous = false;
    let mut renewals = 0;
    loop {
        let seen = renewal.seen();
        let result = call(operation, lock, timeout, request()).await;
        if let Err(err) = &result {
            ambiguous |= may_have_applied(err);
        }
        match result {
            Err(err @ LockError::Unavailable { .. })
                if tokio::time::Instant::now() < retry_until =>
            {
                attempt += 1;
                refused += 1;
                tracing::debug!(%err, attempt, "member unreachable; retrying");
                let pause = (Duration::from_millis(25) * refused).min(Duration::from_millis(250));
                tokio::time::sleep(pause).await;
            }
            // Refused before it was applied (`token_renewal.rs`).
            Err(err) if renewals < MAX_RENEWALS && is_old_auth_revision(&err) => {
                renewals += 1;
                if let Err(end) = renewal.resend_after(err, seen, timeout).await {
                    return Attempts {
                        result: Err(end),
                        ambiguous,
                    };
                }
            }
            Err(err @ LockError::Timeout { .. }) if !timed_out => {
                timed_out = true;
                attempt += 1;
                refused = 0;
                retry_until = tokio::time::Instant::now() + timeout;
                tracing::debug!(%err, "no answer; retrying once");
            }
            result => return Attempts { result, ambiguous },
        }
    }
}

/// Signs, in an unavailable request's error, that it never reached the server: a refused
/// connection; hyper's `Canceled` kind ("a pending item was dropped before ever being
/// processed": a request queued on a connection that closed, or was not ready, before
/// it was written); the require-leader interceptor's "no leader" (`v3rpc/interceptor.go`,
/// before the handler runs); fencelock's transport's own mark of a request it never
/// handed over.
const NEVER_SENT: [&str; 5] = [
    "connect error",
    "Connection refused",
    "hyper::Error(Canceled",
    "etcdserver: no leader",
    // fencelock's own transport: no connection, or h2 refused to open the stream
    // (`grpc_transport/mod.rs`).
    crate::grpc_transport::NOT_SENT,
];

/// A proxy's answer for a member it could not reach or lost mid-request (Envoy's local
/// reply for gRPC), which contains the [`NEVER_SENT`] sign "connect error" but says
/// nothing of whether the request was forwarded.
const PROXY_ANSWER: &str = "upstream connect error";

/// etcd's answers that refuse a request before it enters Raft, or that Raft refused on
/// every member alike (`etcdserver/api/v3rpc/rpctypes/error.go`; `v3_server.go`
/// `processInternalRaftRequestOnce`, `apply.go`, `apply_auth.go`).
const REFUSED: [&str; 9] = [
    "etcdserver: too many requests",
    // gRPC's own refusal of a request over the server's receive limit, before any handler
    // (etcd's grpc-go server). Behind an `etcd grpc-proxy` the proxy's client could say
    // the same of an answer after the request was applied: no proxy is assumed.
    "grpc: received message larger than max",
    "etcdserver: request is too large",
    "etcdserver: too many operations in txn request",
    "etcdserver: duplicate key given in txn request",
    "etcdserver: requested lease not found",
    "etcdserver: invalid auth token",
    "etcdserver: revision of auth store is old",
    "raft proposal dropped",
];

/// Whether a request that failed with `err` may have been applied, or may still be
/// applied later: no answer at all, a connection that broke with the request sent, a
/// stream reset, etcd's own "request timed out" (the proposal is in Raft, `v3_server.go`
/// `processInternalRaftRequestOnce`), or anything not known to prove otherwise. Only
/// failures that prove the request never entered Raft, or was refused by it, are not:
/// [`NEVER_SENT`], [`REFUSED`], refused permissions and bad input. When in doubt: yes.
pub(crate) fn may_have_applied(err: &LockError) -> bool {
    match err {
        LockError::PermissionDenied { .. }
        | LockError::InvalidConfig { .. }
        | LockError::InvalidName { .. }
        | LockError::InvalidOption { .. } => false,
        LockError::Unavailable { source, .. } | LockError::Backend { source, .. } => {
            let text = source.to_string();
            // A proxy's own answer (Envoy's "upstream connect error or disconnect/reset
            // before headers") may follow a request it forwarded: not a sign.
            if text.contains(PROXY_ANSWER) {
                return true;
            }
            !NEVER_SENT
                .iter()
                .chain(REFUSED.iter())
                .any(|sign| text.contains(sign))
        }
        _ => true,
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
    // etcd-client's error exposes no source chain: start from what it wraps.
    let inner: Option<&(dyn std::error::Error + 'static)> = match &err {
        E::GRpcStatus(status) => Some(status),
        E::TransportError(transport) => Some(transport),
        E::IoError(io) => Some(io),
        _ => None,
    };
    if let Some(reason) = inner.and_then(crate::tls::describe_tls_failure) {
        return LockError::Tls {
            backend: Backend::Etcd,
            operation,
            reason,
        };
    }
    let kind = match &err {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                Kind::Unavailable
            }
            // A connection reset mid-request surfaces as Unknown "transport error", or, when
            // it breaks the answer's body, "h2 protocol error: error reading a body from
            // connection" (seen in `watch_stream_lost.rs` when the link broke just after
            // a join was applied): the member is unreachable, the request's fate unknown.
            Code::Unknown
                if status.message().contains("transport error")
                    || status.message().contains("h2 protocol error") =>
            {
                Kind::Unavailable
            }
            Code::PermissionDenied | Code::Unauthenticated => Kind::Denied(status.message()),
            // etcd answers a wrong password, or no user at all, with InvalidArgument.
            Code::InvalidArgument
                if status.message().contains("authentication failed")
                    || status.message().contains("user name is empty") =>
            {
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
        let reset = map_error(
            "acquire",
            Some("x"),
            etcd_client::Error::GRpcStatus(tonic::Status::unknown(
                "h2 protocol error: error reading a body from connection",
            )),
        );
        assert!(reset.is_unavailable(), "{reset:?}");
        assert!(
            may_have_applied(&reset),
            "a reset answer leaves the fate unknown"
        );
        let proxied = map_error(
            "acquire",
            Some("x"),
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                "upstream connect error or disconnect/reset before headers. reset reason: \
                 connection termination",
            )),
        );
        assert!(may_have_applied(&proxied), "a proxy may have forwarded it");
        let refused = map_error(
            "acquire",
            Some("x"),
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                "tcp connect error: Connection refused (os error 111)",
            )),
        );
        assert!(!may_have_applied(&refused), "never sent");
        let other = map_error(
            "acquire",
            None,
            etcd_client::Error::GRpcStatus(tonic::Status::internal("boom")),
        );
        assert!(matches!(other, LockError::Backend { .. }));
    }

    /// Attempts of a call: the first is never answered, the next `refused` find their
    /// member unreachable, the rest succeed.
    async fn attempt(n: u32, refused: u32) -> Result<(), etcd_client::Error> {
        match n {
            0 => std::future::pending().await,
            n if n <= refused => Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                "tcp connect error",
            ))),
            _ => Ok(()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_retry_after_a_timeout_rides_out_an_unreachable_member() {
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let renewal = super::super::token_renewal::unused().await;
        let timeout = Duration::from_secs(1);
        let outcome = call_retrying_noting("acquire", Some("x"), timeout, &renewal, || {
            attempt(
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                2,
            )
        })
        .await;
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        assert!(outcome.ambiguous, "the first attempt's fate is unknown");
        assert_eq!(attempts.into_inner(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_retry_after_a_timeout_gives_up_when_its_own_window_ends() {
        let started = tokio::time::Instant::now();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let renewal = super::super::token_renewal::unused().await;
        let timeout = Duration::from_secs(1);
        let outcome = call_retrying_noting("acquire", Some("x"), timeout, &renewal, || {
            attempt(
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                u32::MAX,
            )
        })
        .await;
        let err = outcome
            .result
            .expect_err("unreachable after the timeout throughout");
        assert!(err.is_unavailable(), "{err}");
        // The timeout at 1 s, then a second of retries, the last pause at most 250 ms.
        let spent = started.elapsed();
        assert!(
            spent >= Duration::from_secs(2) && spent < Duration::from_millis(2_250),
            "{spent:?}"
        );
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
