//! The transport as a tower service for etcd-client (`Channel::Custom`): one connection
//! at a time, to one member, moving on to the next (in an order of its own) when it
//! fails.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::Authority;
use tonic::Status;

use super::NOT_SENT;
use super::answer::{Answer, send_body};
use super::connection::{self, InFlight, State};

/// fencelock's transport to a list of etcd members (see the module's documentation).
/// Cheap to clone: clones share the connection.
#[derive(Clone, Debug)]
pub(crate) struct Lane {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    endpoints: Vec<Authority>,
    connect_timeout: Duration,
    /// `connection::UNSERVED_AFTER`, or half the request timeout if less.
    unserved_after: Duration,
    /// The connection requests go out on, if one is open.
    live: Mutex<Option<Live>>,
    /// One connect at a time: requests that find no connection wait for the one being
    /// made.
    connecting: tokio::sync::Mutex<()>,
    /// Which endpoint to connect to next (modulo their number). Moved on *before* a
    /// connect starts, so that a connect cut short (its caller timed out on a silent
    /// member) leaves the next attempt to the next member. The endpoints are in an order
    /// of this client's own, drawn at random: going round it tries every member once
    /// per round, and a fleet of clients spreads over the members (at the start, and
    /// when they leave one), as under tonic's balancer.
    next: AtomicUsize,
}

#[derive(Clone)]
struct Live {
    send: SendRequest<Bytes>,
    state: Arc<State>,
    endpoint: usize,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Lane {
    /// A transport to `endpoints` (`host:port`, at least one), connecting within
    /// `connect_timeout` when a request first needs it; its callers give up on a request
    /// after `request_timeout`.
    pub(crate) fn new(
        endpoints: Vec<Authority>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        let mut endpoints = endpoints;
        shuffle(&mut endpoints);
        Self {
            shared: Arc::new(Shared {
                endpoints,
                connect_timeout,
                unserved_after: connection::UNSERVED_AFTER.min(request_timeout / 2),
                live: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                next: AtomicUsize::new(0),
            }),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Option<Live>> {
        self.shared
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The open connection, if it is usable; a closed one, or one a request was given up
    /// on unanswered (`connection.rs`), is forgotten and the next connect goes to the
    /// next member.
    fn current(&self) -> Option<Live> {
        let mut live = self.live();
        match live.as_ref() {
            Some(open) if open.state.is_usable() => Some(open.clone()),
            Some(_) => {
                if let Some(closed) = live.take() {
                    self.move_past(closed.endpoint);
                }
                None
            }
            None => None,
        }
    }

    /// The next connect goes to the member after `endpoint` in this client's order.
    fn move_past(&self, endpoint: usize) {
        self.shared.next.store(endpoint + 1, Ordering::Relaxed);
    }

    /// Leaves `failed` for the next member, unless another request already did.
    fn retire(&self, failed: &Live) {
        let mut live = self.live();
        if live
            .as_ref()
            .is_some_and(|open| Arc::ptr_eq(&open.state, &failed.state))
        {
            *live = None;
            self.move_past(failed.endpoint);
        }
    }

    /// The connection to send on: the open one, or a new one to the next member.
    async fn connection(&self) -> Result<Live, Status> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let _one = self.shared.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let count = self.shared.endpoints.len();
        if count == 0 {
            return Err(Status::unavailable(format!("{NOT_SENT}: no endpoints")));
        }
        let endpoint = self.shared.next.load(Ordering::Relaxed) % count;
        self.move_past(endpoint);
        let authority = &self.shared.endpoints[endpoint];
        // Each member gets a share of the connect timeout: a host that drops the
        // connect leaves time for the others (etcd-client's probe and retries ride on).
        let members = u32::try_from(count).unwrap_or(u32::MAX);
        let timeout = (self.shared.connect_timeout / members)
            .max(MIN_CONNECT_SHARE)
            .min(self.shared.connect_timeout);
        let failed = |reason: String| {
            Status::unavailable(format!(
                "{NOT_SENT}: tcp connect error: {authority}: {reason}"
            ))
        };
        let (send, state) = match tokio::time::timeout(
            timeout,
            connection::open(authority, self.shared.unserved_after),
        )
        .await
        {
            Ok(Ok(opened)) => opened,
            Ok(Err(err)) => return Err(failed(err.to_string())),
            Err(_) => return Err(failed(format!("no connection within {timeout:?}"))),
        };
        tracing::debug!(member = %authority, "connected");
        let live = Live {
            send,
            state,
            endpoint,
        };
        *self.live() = Some(live.clone());
        Ok(live)
    }

    /// A connection ready for a new stream. One that closed since it was taken (a
    /// GOAWAY: a member restarting) is left, and a new one taken, once: nothing was sent.
    async fn ready(&self) -> Result<(Live, SendRequest<Bytes>), Status> {
        let live = self.connection().await?;
        match live.send.clone().ready().await {
            Ok(send) => return Ok((live, send)),
            Err(err) => {
                tracing::debug!(%err, "connection closed: taking a new one");
                self.retire(&live);
            }
        }
        let live = self.connection().await?;
        match live.send.clone().ready().await {
            Ok(send) => Ok((live, send)),
            Err(err) => {
                self.retire(&live);
                Err(not_sent(&err))
            }
        }
    }

    /// Sends `request` and returns its answer (headers; the body is read by tonic).
    async fn send(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<tonic::body::Body>, Status> {
        let (live, mut send) = self.ready().await?;
        let (mut parts, body) = request.into_parts();
        // tonic gives the path alone; h2 needs the scheme and authority too.
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .ok_or_else(|| Status::internal(format!("{NOT_SENT}: a request without a path")))?;
        parts.uri = http::Uri::builder()
            .scheme(http::uri::Scheme::HTTP)
            .authority(self.shared.endpoints[live.endpoint].clone())
            .path_and_query(path)
            .build()
            .map_err(|err| Status::internal(format!("{NOT_SENT}: {err}")))?;
        let request = http::Request::from_parts(parts, ());
        let (answer, mut stream) = match send.send_request(request, false) {
            Ok(opened) => opened,
            Err(err) => {
                self.retire(&live);
                return Err(not_sent(&err));
            }
        };
        let mut in_flight = InFlight::new(&live.state);
        send_body(body, &mut stream).await?;
        let answer = match answer.await {
            Ok(answer) => answer,
            Err(err) => {
                if err.is_remote() && err.is_reset() {
                    // The member reset the stream: alive, if not for this request.
                    in_flight.answered();
                }
                if err.is_io() || err.is_go_away() || !live.state.is_usable() {
                    self.retire(&live);
                }
                return Err(fate_unknown("transport error", &err));
            }
        };
        if let Some(code) = answer.headers().get("grpc-status") {
            // A status in the headers is the whole answer (gRPC's trailers-only form),
            // which tonic reads without reading the body.
            in_flight.answered();
            // A member that cannot serve answers at once: Unavailable (require-leader's
            // "no leader": cut off into a minority), or "too many requests" (its apply
            // fell 5,000 entries behind its commits: a defragmentation, a stalled disk;
            // `etcdserver/v3_server.go`, `maxGapBetweenApplyAndCommitIndex`). Those quick
            // refusals count as answers, so the next request goes to the next member.
            let message = answer.headers().get("grpc-message");
            let too_many = code.as_bytes() == b"8"
                && message.is_some_and(|text| {
                    text.as_bytes()
                        .windows(TOO_MANY.len())
                        .any(|window| window == TOO_MANY)
                });
            if code.as_bytes() == b"14" || too_many {
                self.retire(&live);
            }
        }
        Ok(answer.map(|stream| tonic::body::Body::new(Answer::new(stream, in_flight))))
    }
}

/// h2 refused to open the stream: nothing of the request was queued.
fn not_sent(err: &h2::Error) -> Status {
    Status::unavailable(format!("{NOT_SENT}: the connection closed: {err}"))
}

/// A failure after the request's stream was opened: its fate is unknown. `what` is the
/// text `etcd/call.rs` reads as a broken connection. Only the error's kind follows, never
/// text a server chose (a GOAWAY's debug data): `may_have_applied` reads some words as
/// proof a request was never sent, and a server's text must not pass for them.
pub(super) fn fate_unknown(what: &str, err: &h2::Error) -> Status {
    let kind = if let Some(io) = err.get_io() {
        format!("i/o {:?}", io.kind())
    } else if let Some(reason) = err.reason() {
        let side = if err.is_remote() {
            "by the member"
        } else {
            "here"
        };
        let how = if err.is_go_away() {
            "connection closed"
        } else {
            "stream reset"
        };
        format!("{how} {side} ({reason:?})")
    } else {
        "connection lost".to_owned()
    };
    Status::unavailable(format!("{what}: {kind}"))
}

/// etcd's refusal of a member whose apply fell behind (`ErrTooManyRequests`,
/// ResourceExhausted).
const TOO_MANY: &[u8] = b"too many requests";

/// The least share of the connect timeout a member gets.
const MIN_CONNECT_SHARE: Duration = Duration::from_millis(250);

/// A random number (std's hasher keys are random per process and per `RandomState`).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Puts `items` in a random order (Fisher-Yates).
fn shuffle<T>(items: &mut [T]) {
    for last in (1..items.len()).rev() {
        let bound = u64::try_from(last + 1).unwrap_or(u64::MAX);
        let pick = usize::try_from(random() % bound).unwrap_or(0);
        items.swap(last, pick);
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Lane {
    type Response = http::Response<tonic::body::Body>;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Connecting happens in the request's own future, bounded by its caller's time.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let lane = self.clone();
        Box::pin(async move { lane.send(request).await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shuffle_keeps_every_endpoint_once() {
        for len in 0..6 {
            let mut items: Vec<usize> = (0..len).collect();
            super::shuffle(&mut items);
            items.sort_unstable();
            assert_eq!(items, (0..len).collect::<Vec<_>>());
        }
    }
}
