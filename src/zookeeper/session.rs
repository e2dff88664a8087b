//! One ZooKeeper session: the "lease" every lock node of it lives by.
//!
//! A lock node is ephemeral: the server deletes it when the session that created it ends
//! (expired, closed). So the session plays the part of etcd's lease, and its loss is
//! broadcast to every guard of it. The server expires a session that it has not heard
//! from for the negotiated session timeout; this side keeps a local deadline on the
//! boot-time clock ([`LeaseClock`]), which a lock is trusted until and reported lost at.
//!
//! The deadline must come before the leader, the only member that expires sessions, can
//! expire the session and hand the lock to someone else, whichever member the client talks
//! to (within the limits `heartbeat.rs` lists: a stale leader still answering, observer
//! masters, a ping late by a twentieth of the timeout). So the heartbeat is a `sync`, which a follower forwards to the leader, and an
//! answered heartbeat moves the deadline to the send time of an *earlier* heartbeat plus
//! the timeout: one answered at least a ping period before the later one was sent, whose
//! touch of the session the follower has then reported to the leader. Why that holds, and
//! what it assumes, is in `heartbeat.rs`. (A read as heartbeat, as before, left a window:
//! a follower cut off from the leader answers reads for up to `syncLimit × tickTime`,
//! while the leader expires the session and grants the lock to another session;
//! `tests/zookeeper/follower_cut_off.rs` shows the holder learning of its loss 1.9 s after
//! the next grant with it.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError, SessionState};

use super::ZooKeeperConfig;
use super::error::{RequestError, timed};
use super::heartbeat::Answered;
use crate::lease_clock::{Clock, ClockInstant, LeaseClock};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::{Backend, LockError, LossReason};

/// The session's client handle; `None` once this side gave the session up.
type Shared = Arc<RwLock<Option<Client>>>;

/// One session, shared by the locks taken with the same TTL (or owned by one lock taken
/// without renewal). Dropping the last handle closes it.
pub(crate) struct Session {
    /// `None` once closed by this side: later requests fail with `ClientClosed`.
    client: Shared,
    pub(crate) loss: LossWatch,
    pub(crate) clock: Arc<LeaseClock>,
    pub(crate) request_timeout: Duration,
    /// The session timeout the server granted.
    pub(crate) timeout: Duration,
    /// The ZooKeeper session id (hex in messages).
    pub(crate) id: i64,
    /// Set once a create's outcome was unknown: no new acquisition joins this session,
    /// which closes when its last lock is gone (with any node a late create left).
    retired: AtomicBool,
    monitor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:#x}", self.id))
            .field("timeout", &self.timeout)
            .field("lost", &self.loss.current())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session asking for `ttl` as its timeout. With `renew` off, the session
    /// (and every lock in it) ends `ttl` after it was opened, however alive this side is.
    #[tracing::instrument(skip(config), fields(backend = "zookeeper"))]
    pub(crate) async fn open(
        config: &ZooKeeperConfig,
        ttl: Duration,
        renew: bool,
    ) -> Result<Arc<Self>, LockError> {
        let clock = Clock::BOOT;
        let mut asked = ttl;
        let (client, sent) = loop {
            let sent = clock.now();
            let client = connect(config, asked).await?;
            let granted = client.session_timeout();
            // The connection timeout must be a fifth of the timeout the server granted
            // (see `connect`): a session whose timeout the server raised or lowered is
            // given up at once (it holds no node yet) and asked for again with the
            // granted timeout, once.
            if granted == asked || asked != ttl {
                break (client, sent);
            }
            tracing::debug!(
                ?ttl,
                ?granted,
                "session timeout changed by the server; reconnecting"
            );
            asked = granted;
        };
        let timeout = client.session_timeout();
        // Without renewal the lock ends with its TTL, whatever the server granted.
        let hard_end = (!renew).then(|| sent + ttl);
        let first = cap(sent + timeout, hard_end);
        let lease = Arc::new(LeaseClock::new(clock, first));
        let (notifier, loss) = loss_channel(Backend::ZooKeeper);
        let id = client.session_id().0;
        let shared: Shared = Arc::new(RwLock::new(Some(client.clone())));
        // The end is made here and moved in: a monitor dropped before it was first polled
        // (its runtime gone) ends the session too.
        let end = MonitorEnd {
            notifier,
            shared: shared.clone(),
        };
        let monitor = tokio::spawn(monitor(
            client,
            end,
            lease.clone(),
            Answered::new(timeout, sent),
            config.request_timeout,
            hard_end,
        ));
        tracing::debug!(
            session = format_args!("{id:#x}"),
            ?timeout,
            "session opened"
        );
        Ok(Arc::new(Self {
            client: shared,
            loss,
            clock: lease,
            request_timeout: config.request_timeout,
            timeout,
            id,
            retired: AtomicBool::new(false),
            monitor,
        }))
    }

    /// A handle for one request; `ClientClosed` once the session was given up.
    pub(crate) fn client(&self) -> Result<Client, RequestError> {
        self.client
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(RequestError::Server(ZkError::ClientClosed))
    }

    /// Whether new acquisitions may still use this session.
    pub(crate) fn usable(&self) -> bool {
        self.loss.current().is_none() && !self.clock.has_passed()
    }

    /// Whether a new acquisition may join this session: it is usable and not retired.
    pub(crate) fn accepts_new(&self) -> bool {
        self.usable() && !self.retired.load(Ordering::Relaxed)
    }

    /// Lets no new acquisition join this session (see [`accepts_new`](Self::accepts_new)):
    /// it ends when the locks and removals that hold it are done.
    pub(crate) fn retire(&self) {
        if !self.retired.swap(true, Ordering::Relaxed) {
            tracing::debug!(session = format_args!("{:#x}", self.id), "session retired");
        }
    }

    /// Runs `request` on this session with the request timeout.
    pub(crate) async fn call<T, F, Fut>(&self, request: F) -> Result<T, RequestError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ZkError>>,
    {
        let client = self.client()?;
        timed(self.request_timeout, request(client)).await
    }
}

impl Session {
    /// Stops the monitor as a panic in it would (for tests: the session must still end).
    pub(crate) fn stop_monitor_for_test(&self) {
        self.monitor.abort();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The monitor holds a client handle: without it the last handle goes and the
        // session is closed on the server (its lock nodes deleted).
        self.monitor.abort();
    }
}

/// Connects a new session asking for `timeout`.
///
/// Not failing eagerly: during an election every member refuses sessions for a moment;
/// the client cycles through them until the connect timeout. A connection that went
/// silent is given up after a fifth of the session timeout (the client library's
/// default is 0.4 of it): the deadline lies only 0.6 of the timeout past the last
/// answered heartbeat's sending (`heartbeat.rs`), and the heartbeat sent on the
/// reconnection, perhaps after a try through another silent member, must be answered
/// before it.
async fn connect(config: &ZooKeeperConfig, timeout: Duration) -> Result<Client, LockError> {
    let connector = Client::connector()
        .with_session_timeout(timeout)
        .with_connection_timeout(timeout / 5);
    match tokio::time::timeout(config.connect_timeout, connector.connect(&config.hosts)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(RequestError::Server(err).into_lock_error("connect", None)),
        Err(_) => Err(LockError::Timeout {
            backend: Backend::ZooKeeper,
            operation: "connect",
            lock: None,
            after: config.connect_timeout,
        }),
    }
}

fn cap(deadline: ClockInstant, hard_end: Option<ClockInstant>) -> ClockInstant {
    match hard_end {
        Some(end) => deadline.min(end),
        None => deadline,
    }
}

/// Keeps the local deadline (a heartbeat every tenth of the timeout, send to send, one
/// right after the session opens and one on every reconnection; see `heartbeat.rs` for
/// what an answer proves), and marks the loss: the server reports the session expired or
/// closed, or the local deadline passes.
/// After a loss the session is closed from this side too, so that a lock this side has
/// reported lost is really given up (the client library would otherwise keep pinging).
///
/// The heartbeat's schedule lives outside the loop: a session state event (disconnected,
/// reconnected) must not restart it, or a connection that drops and comes back within
/// the timeout would push the next heartbeat past the local deadline (a false loss).
async fn monitor(
    client: Client,
    end: MonitorEnd,
    lease: Arc<LeaseClock>,
    mut answered: Answered,
    request_timeout: Duration,
    hard_end: Option<ClockInstant>,
) {
    let mut states = client.state_watcher();
    // A heartbeat that hangs must not keep the next one from going out: give up on it
    // when the next is due.
    let answer_wait = request_timeout.min(answered.interval());
    let beat = heartbeat(client.clone(), lease.clone(), Duration::ZERO, answer_wait);
    let mut beat = std::pin::pin!(beat);
    let reason = loop {
        tokio::select! {
            state = states.changed() => match state {
                SessionState::Expired | SessionState::AuthFailed => break LossReason::Revoked,
                SessionState::Closed => break LossReason::Closed,
                // Reconnected: confirm the session at once (a heartbeat in flight on the
                // broken connection is not waited for).
                SessionState::SyncConnected => {
                    beat.set(heartbeat(client.clone(), lease.clone(), Duration::ZERO, answer_wait));
                }
                _ => {}
            },
            () = lease.passed() => break LossReason::Expired,
            (sent, answer) = &mut beat => {
                match answer {
                    Ok(()) => {
                        let proven = answered.confirm(sent, lease.now());
                        if let Some(deadline) = proven
                            && !lease.extend_to(cap(deadline, hard_end))
                        {
                            // Answered after the deadline passed: the guard already
                            // reported the lock gone; it is not revived.
                            break LossReason::Expired;
                        }
                    }
                    Err(err) => match err.session_gone() {
                        Some(reason) => break reason,
                        None => tracing::debug!(%err, "heartbeat failed"),
                    },
                }
                // Send to send: a heartbeat answered late (or given up on) is followed
                // by the next one sooner, so that the beats keep their pace (or at the
                // moment an answer becomes provable: `Answered::next_send`).
                let next = answered.next_send(sent).saturating_duration_since(lease.now());
                beat.set(heartbeat(client.clone(), lease.clone(), next, answer_wait));
            }
        }
    };
    tracing::debug!(%reason, "session lost");
    end.notifier.mark(reason);
    // The session's client handle goes first (`MonitorEnd`), then this one, the last.
    drop(end);
    drop(client);
}

/// What the monitor does when it ends, however it ends: marks the loss (`Unrenewed` if
/// it had not marked one: a panic in it, or its runtime gone; the first reason wins) and
/// takes the session's client handle, so that the session closes from this side. Without
/// it, a monitor that died left the client library pinging a session every guard of
/// which reads as lost, its lock nodes blocking the next holders until the guards went.
/// (An abort by `Session::drop` comes when no guard is left: nothing reads the mark.)
struct MonitorEnd {
    notifier: LossNotifier,
    shared: Shared,
}

impl Drop for MonitorEnd {
    fn drop(&mut self) {
        // `mark` catches a panicking recorder: no second panic during an unwind.
        self.notifier.mark(LossReason::Unrenewed);
        self.shared
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// One heartbeat `after` from now (a `sync`, answered through the leader): its send time
/// on the lease's clock, and its answer.
async fn heartbeat(
    client: Client,
    lease: Arc<LeaseClock>,
    after: Duration,
    answer_wait: Duration,
) -> (ClockInstant, Result<(), RequestError>) {
    tokio::time::sleep(after).await;
    let sent = lease.now();
    let answer = timed(answer_wait, client.sync("/")).await;
    (sent, answer)
}
