//! One HTTP/2 connection to one etcd member: opened over TCP, driven by a task of its
//! own, pinged while requests are in flight.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
/// The least time between two pings: above etcd's `--grpc-keepalive-min-time` (5 s by
/// default; grpc-go measures it between arrivals, so a margin for jitter), below which
/// grpc-go answers pings (three times) with GOAWAY `too_many_pings`, failing the
/// requests in flight.
const PING_GAP: Duration = Duration::from_secs(6);

/// A request given up unanswered after this long (or half the request timeout, if
/// less), with no answer at all on its connection for as long, says the member is not
/// serving (a defragmentation, a stalled disk, a silent connection): the connection is
/// left for another member. A healthy member answers in milliseconds; a caller that
/// gives up sooner (its own wait ended), or while other answers come, says nothing
/// about the member.
pub(super) const UNSERVED_AFTER: Duration = Duration::from_millis(250);

/// TCP keep-alive while the connection is idle (no requests, so no pings): keeps a NAT
/// or load balancer from forgetting the flow, and ends a connection whose peer is gone
/// within about 25 s, without HTTP/2 pings (which etcd counts against an idle client).
const TCP_IDLE: Duration = Duration::from_secs(10);
const TCP_PROBE_EVERY: Duration = Duration::from_secs(5);
const TCP_PROBES: u32 = 3;

/// Flow-control windows: an answer of a batch of joins can be megabytes
/// (`etcd/answers.rs`); h2's default 64 KiB stream window would take a round trip per
/// 64 KiB of it.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// What a connection's users and its driver share.
#[derive(Debug)]
pub(super) struct State {
    /// The driver ended: the connection is closed or was found dead.
    closed: AtomicBool,
    /// A request on it was given up unanswered after `unserved_after`, with no answer on
    /// the connection for as long: new requests go to another member (those in flight
    /// finish here).
    unserved: AtomicBool,
    /// [`UNSERVED_AFTER`], or half the request timeout if less.
    unserved_after: Duration,
    /// When the connection opened, and when (microseconds after that) the member last
    /// answered anything on it.
    opened: std::time::Instant,
    last_answer: AtomicU64,
    /// Requests sent whose answer is not yet read to its end.
    in_flight: AtomicUsize,
    /// A request was given up before its answer came (its caller timed out): the driver
    /// pings at once, so that a connection gone silent is dropped within
    /// [`PING_ANSWER`] of that, not only once a request happens to be in flight at a
    /// tick (a caller that times out and retries leaves few in flight at any instant).
    suspect: tokio::sync::Notify,
}

impl State {
    fn new(unserved_after: Duration) -> Self {
        Self {
            closed: AtomicBool::new(false),
            unserved: AtomicBool::new(false),
            unserved_after,
            opened: std::time::Instant::now(),
            last_answer: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            suspect: tokio::sync::Notify::new(),
        }
    }

    /// Microseconds since the connection opened.
    fn now(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether new requests may go out on this connection: it is open, and no request
    /// on it was given up unanswered for long.
    pub(super) fn is_usable(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.unserved.load(Ordering::Acquire)
    }
}

/// A request in flight on a connection, for as long as it lives (its answer's body
/// holds it): the connection is pinged only while one lives, and at once if one is
/// dropped before its answer was read to its end.
#[derive(Debug)]
pub(super) struct InFlight {
    state: Arc<State>,
    /// Microseconds after the connection opened.
    sent: u64,
    answered: bool,
}

impl InFlight {
    pub(super) fn new(state: &Arc<State>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            state: state.clone(),
            sent: state.now(),
            answered: false,
        }
    }

    /// The member answered (the answer's end, a status in its headers, or a reset of
    /// the stream by the member): it is alive and serving.
    pub(super) fn answered(&mut self) {
        self.answered = true;
        self.heard();
    }

    /// Part of the answer came (a data frame of a large one): the member is serving.
    pub(super) fn heard(&self) {
        self.state
            .last_answer
            .fetch_max(self.state.now(), Ordering::Relaxed);
    }
}

/// Whether a request given up unanswered leaves its connection: it waited `limit` (sent
/// at `sent`) and nothing at all was heard on the connection for as long (last at
/// `last_answer`; microseconds since the connection opened, `now` too). Answers sent
/// before a member stalled still arrive after it stalled, so "nothing since this request
/// was sent" would spare every request in flight then, and their retries would follow
/// them onto it.
fn unserved(now: u64, sent: u64, last_answer: u64, limit: Duration) -> bool {
    let since = |at: u64| Duration::from_micros(now.saturating_sub(at));
    since(sent) >= limit && since(last_answer) >= limit
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.answered {
            return;
        }
        let last_answer = self.state.last_answer.load(Ordering::Relaxed);
        let limit = self.state.unserved_after;
        if unserved(self.state.now(), self.sent, last_answer, limit) {
            self.state.unserved.store(true, Ordering::Release);
        }
        self.state.suspect.notify_one();
    }
}

/// Marks the connection closed however its driver ends (a runtime shutting down drops
/// it unfinished).
struct ClosedOnDrop(Arc<State>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
    }
}

/// Opens a connection to `authority` (the caller bounds the time); its driver runs
/// until the connection ends or stops answering pings, or every sender is dropped.
/// `unserved_after`: see [`UNSERVED_AFTER`].
pub(super) async fn open(
    authority: &Authority,
    unserved_after: Duration,
) -> Result<(SendRequest<Bytes>, Arc<State>), std::io::Error> {
    let tcp = TcpStream::connect(authority.as_str()).await?;
    // A request is one or two small frames: sent at once, not held for more.
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_IDLE)
        .with_interval(TCP_PROBE_EVERY)
        .with_retries(TCP_PROBES);
    socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive)?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(std::io::Error::other)?;
    let state = Arc::new(State::new(unserved_after));
    let span = tracing::debug_span!("etcd connection", member = %authority);
    // Made before the spawn and moved in: a task dropped before its first poll (a
    // runtime shutting down) marks the connection closed too.
    let closed = ClosedOnDrop(state.clone());
    tokio::spawn(drive(connection, closed).instrument(span));
    Ok((send, state))
}

/// Runs the connection's reads and writes; pings it while requests are in flight and
/// drops it (failing its requests) if a ping goes unanswered.
async fn drive(mut connection: h2::client::Connection<TcpStream, Bytes>, closed: ClosedOnDrop) {
    let state = &closed.0;
    let mut ping = connection.ping_pong();
    let mut connection = pin!(connection);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the ping in flight must be answered by, and when the last one was sent.
    let mut answer_by: Option<tokio::time::Instant> = None;
    let mut last_ping: Option<tokio::time::Instant> = None;
    loop {
        // Biased: the connection's reads first (a pong already read must count before
        // its deadline, after the process was paused), then the pong, then the rest.
        let ping_now = tokio::select! {
            biased;
            ended = &mut connection => {
                if let Err(err) = ended {
                    tracing::debug!(%err, "connection ended");
                }
                break;
            }
            _ = tick.tick(), if answer_by.is_none() => {
                state.in_flight.load(Ordering::Relaxed) > 0
                    && last_ping.is_none_or(|at| at.elapsed() >= PING_GAP)
            }
            () = state.suspect.notified(), if answer_by.is_none() => {
                let due = last_ping.is_none_or(|at| at.elapsed() >= PING_GAP);
                if due {
                    tracing::debug!("a request was given up unanswered: pinging");
                }
                due
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
            let now = tokio::time::Instant::now();
            last_ping = Some(now);
            answer_by = Some(now + PING_ANSWER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request given up unanswered leaves its connection only if it waited long and
    /// nothing was heard on the connection for as long (microseconds; limit 250 ms).
    #[test]
    fn a_connection_is_left_only_for_a_long_wait_without_any_answer() {
        let limit = Duration::from_millis(250);
        // Given up at once.
        assert!(!unserved(1_000, 900, 0, limit));
        // Waited 300 ms, another answer 10 ms ago: the member is serving.
        assert!(!unserved(400_000, 100_000, 390_000, limit));
        // Waited 300 ms; the last answer came after it was sent (one already on its way
        // when the member went silent), but 280 ms ago: left.
        assert!(unserved(400_000, 100_000, 120_000, limit));
        // Nothing ever answered on a connection opened 300 ms ago.
        assert!(unserved(300_000, 0, 0, limit));
        // An answer timed after this drop's clock read (another thread): kept.
        assert!(!unserved(400_000, 100_000, 400_010, limit));
    }

    /// A runtime shutting down before the connection's driver first ran (a task dropped
    /// unpolled) leaves the connection closed, not usable: a request on it would wait on
    /// a driver that never runs.
    #[test]
    fn a_connection_whose_driver_never_ran_is_closed() {
        // The handshake only writes the client's preface: a bound socket, never accepted
        // from, is enough.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        let port = listener.local_addr().expect("address").port();
        let authority: Authority = format!("127.0.0.1:{port}").parse().expect("authority");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // A current-thread runtime runs spawned tasks only while `block_on` waits: the
        // driver, spawned as `open` returns, is dropped with the runtime unpolled.
        let (_send, state) = runtime
            .block_on(open(&authority, Duration::from_secs(1)))
            .expect("open");
        drop(runtime);
        assert!(!state.is_usable(), "closed with its runtime");
    }

    #[test]
    fn a_request_dropped_unanswered_marks_the_connection_by_the_rule() {
        let state = Arc::new(State::new(Duration::ZERO));
        let mut answered = InFlight::new(&state);
        answered.answered();
        drop(answered);
        assert!(state.is_usable(), "answered");
        drop(InFlight::new(&state));
        assert!(!state.is_usable(), "a zero limit leaves at the first drop");
    }
}
