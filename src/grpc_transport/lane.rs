//! The transport as a tower service for etcd-client (`Channel::Custom`): one connection
//! at a time, to one member, moving on to the next when it fails.

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
    /// The connection requests go out on, if one is open.
    live: Mutex<Option<Live>>,
    /// One connect at a time: requests that find no connection wait for the one being
    /// made.
    connecting: tokio::sync::Mutex<()>,
    /// Which endpoint to connect to next (modulo their number). Moved on *before* a
    /// connect starts, so that a connect cut short (its caller timed out on a silent
    /// member) leaves the next attempt to the next member.
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
    /// `connect_timeout` when a request first needs it.
    pub(crate) fn new(endpoints: Vec<Authority>, connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                endpoints,
                connect_timeout,
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

    /// The open connection, if its driver still runs; a closed one is forgotten and the
    /// next connect goes to the next member.
    fn current(&self) -> Option<Live> {
        let mut live = self.live();
        match live.as_ref() {
            Some(open) if !open.state.is_closed() => Some(open.clone()),
            Some(_) => {
                if let Some(closed) = live.take() {
                    self.move_past(closed.endpoint);
                }
                None
            }
            None => None,
        }
    }

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
        let endpoint = self.shared.next.load(Ordering::Relaxed) % count;
        self.move_past(endpoint);
        let authority = &self.shared.endpoints[endpoint];
        let timeout = self.shared.connect_timeout;
        let failed = |reason: String| {
            Status::unavailable(format!(
                "{NOT_SENT}: tcp connect error: {authority}: {reason}"
            ))
        };
        let (send, state) = match tokio::time::timeout(timeout, connection::open(authority)).await {
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

    /// Sends `request` and returns its answer (headers; the body is read by tonic).
    async fn send(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<tonic::body::Body>, Status> {
        let live = self.connection().await?;
        let (mut parts, body) = request.into_parts();
        // tonic gives the path alone; h2 needs the scheme and authority too.
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .ok_or_else(|| Status::internal(format!("{NOT_SENT}: a request without a path")))?;
        let authority = self.shared.endpoints[live.endpoint].clone();
        parts.uri = http::Uri::builder()
            .scheme(http::uri::Scheme::HTTP)
            .authority(authority)
            .path_and_query(path)
            .build()
            .map_err(|err| Status::internal(format!("{NOT_SENT}: {err}")))?;
        // h2 refuses to open a stream before queueing anything of it: not sent.
        let not_sent = |err: h2::Error| {
            Status::unavailable(format!("{NOT_SENT}: the connection closed: {err}"))
        };
        let ready = live.send.clone().ready().await;
        let opened = ready
            .and_then(|mut send| send.send_request(http::Request::from_parts(parts, ()), false));
        let (answer, mut stream) = match opened {
            Ok(opened) => opened,
            Err(err) => {
                self.retire(&live);
                return Err(not_sent(err));
            }
        };
        let in_flight = InFlight::new(&live.state);
        send_body(body, &mut stream).await?;
        let answer = match answer.await {
            Ok(answer) => answer,
            Err(err) => {
                if err.is_io() || err.is_go_away() || live.state.is_closed() {
                    self.retire(&live);
                }
                return Err(Status::unavailable(format!("transport error: {err}")));
            }
        };
        // A member that cannot serve (require-leader's "no leader": cut off into a
        // minority) answers Unavailable at once, in the headers: the next request goes
        // to the next member.
        if answer
            .headers()
            .get("grpc-status")
            .is_some_and(|code| code.as_bytes() == b"14")
        {
            self.retire(&live);
        }
        Ok(answer.map(|stream| tonic::body::Body::new(Answer::new(stream, in_flight))))
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
