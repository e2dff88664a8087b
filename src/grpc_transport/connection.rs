//! One HTTP/2 connection to one etcd member: opened over TCP, driven by a task of its
//! own, pinged while requests are in flight.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::Authority;
use tokio::net::TcpStream;
use tracing::Instrument;

/// How often a connection with requests in flight is pinged, and how long the answer
/// may take (the tonic channel's keep-alive, `etcd/config.rs`).
const PING_EVERY: Duration = Duration::from_secs(10);
const PING_ANSWER: Duration = Duration::from_secs(5);

/// Flow-control windows: an answer of a batch of joins can be megabytes
/// (`etcd/answers.rs`); h2's default 64 KiB stream window would take a round trip per
/// 64 KiB of it.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// What a connection's users and its driver share.
#[derive(Debug, Default)]
pub(super) struct State {
    /// The driver ended: the connection is closed or was found dead.
    closed: AtomicBool,
    /// Requests sent whose answer is not yet read to its end.
    in_flight: AtomicUsize,
    /// A request was given up before its answer came (its caller timed out): the driver
    /// pings at once, so that a connection gone silent is dropped within
    /// [`PING_ANSWER`] of that, not only once a request happens to be in flight at a
    /// tick (a caller that times out and retries leaves few in flight at any instant).
    suspect: tokio::sync::Notify,
}

impl State {
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A request in flight on a connection, for as long as it lives (its answer's body
/// holds it): the connection is pinged only while one lives, and at once if one is
/// dropped before its answer was read to its end.
#[derive(Debug)]
pub(super) struct InFlight {
    state: Arc<State>,
    answered: bool,
}

impl InFlight {
    pub(super) fn new(state: &Arc<State>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            state: state.clone(),
            answered: false,
        }
    }

    /// The answer was read to its end (its trailers, or a refusal in its headers).
    pub(super) fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.answered {
            self.state.suspect.notify_one();
        }
    }
}

/// Opens a connection to `authority` (the caller bounds the time); its driver runs
/// until the connection ends or stops answering pings, or every sender is dropped.
pub(super) async fn open(
    authority: &Authority,
) -> Result<(SendRequest<Bytes>, Arc<State>), std::io::Error> {
    let tcp = TcpStream::connect(authority.as_str()).await?;
    // A request is one or two small frames: sent at once, not held for more.
    tcp.set_nodelay(true)?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(std::io::Error::other)?;
    let state = Arc::new(State::default());
    let span = tracing::debug_span!("etcd connection", member = %authority);
    tokio::spawn(drive(connection, state.clone()).instrument(span));
    Ok((send, state))
}

/// Runs the connection's reads and writes; pings it while requests are in flight and
/// drops it (failing its requests) if a ping goes unanswered.
async fn drive(mut connection: h2::client::Connection<TcpStream, Bytes>, state: Arc<State>) {
    let mut ping = connection.ping_pong();
    let mut connection = pin!(connection);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the ping in flight must be answered by.
    let mut answer_by: Option<tokio::time::Instant> = None;
    loop {
        let ping_now = tokio::select! {
            ended = &mut connection => {
                if let Err(err) = ended {
                    tracing::debug!(%err, "connection ended");
                }
                break;
            }
            _ = tick.tick(), if answer_by.is_none() => {
                state.in_flight.load(Ordering::Relaxed) > 0
            }
            () = state.suspect.notified(), if answer_by.is_none() => {
                tracing::debug!("a request was given up unanswered: pinging");
                true
            }
            pong = std::future::poll_fn(|cx| match ping.as_mut() {
                Some(ping) => ping.poll_pong(cx),
                None => std::task::Poll::Pending,
            }), if answer_by.is_some() => {
                if pong.is_err() {
                    break;
                }
                answer_by = None;
                false
            }
            () = tokio::time::sleep_until(answer_by.unwrap_or_else(tokio::time::Instant::now)),
                if answer_by.is_some() => {
                tracing::debug!(after = ?PING_ANSWER, "ping unanswered: dropping the connection");
                break;
            }
        };
        if let (true, Some(ping)) = (ping_now, ping.as_mut()) {
            if ping.send_ping(h2::Ping::opaque()).is_err() {
                break;
            }
            answer_by = Some(tokio::time::Instant::now() + PING_ANSWER);
        }
    }
    state.closed.store(true, Ordering::Release);
}
