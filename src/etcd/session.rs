//! The session: one lease per client, kept alive by one task for all of its locks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Client, KvClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use super::EtcdConfig;
use super::call::{call_renewing, call_retrying, malformed};
use super::token_renewal::TokenRenewal;
use super::watch_hub::WatchHub;
use crate::lease_clock::{Clock, ClockInstant, LeaseClock};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::retry::{answer_wait, backoff};
use crate::{Backend, LockError, LossReason};

/// A lease shared by every lock a client takes with the same TTL.
///
/// One background task renews it every TTL/3 for all of them, so a client holding 10,000
/// locks sends one keep-alive per tick, not 10,000. When the lease is lost (the server says
/// it is gone, or no renewal is confirmed before its time runs out) every guard of the
/// session learns it at once through [`lost`](Self::lost).
///
/// Cloning is cheap and shares the lease. When the last clone (and the last guard) is
/// dropped, the lease is revoked in the background.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    pub(crate) client: Client,
    /// Authenticates again for requests refused with an old token (`token_renewal.rs`).
    pub(crate) renewal: TokenRenewal,
    /// The key-value client alone: cheaper to clone per request than the whole client.
    pub(crate) kv: KvClient,
    pub(crate) config: Arc<EtcdConfig>,
    lease_id: i64,
    ttl: Duration,
    /// Key names in use (see `slots.rs`).
    pub(crate) slots: super::slots::Slots,
    notifier: Arc<LossNotifier>,
    loss: LossWatch,
    clock: Arc<LeaseClock>,
    /// The client's watches of lock prefixes, shared by all of its sessions.
    pub(crate) hub: Arc<WatchHub>,
    /// Set once a request of an acquisition on this session may still create a key later
    /// (a join without an answer): no new acquisition uses the session, and its lease
    /// (with any such key) is revoked when the last guard on it goes (`key_life.rs`).
    retired: std::sync::atomic::AtomicBool,
    /// Told once when the session is retired (the locker forgets it then, so that nothing
    /// keeps it alive but its guards).
    on_retire: Option<RetireHook>,
    /// Names whose join may still land, swept while the session lives (`late_joins.rs`).
    pub(crate) late_joins: super::late_joins::LateJoins,
    /// This session's joins and releases, batched while one is in flight (`batch.rs`).
    pub(crate) batch: Arc<super::batch::Batcher>,
    control: mpsc::UnboundedSender<Control>,
    // Dropped with the last handle: tells the keep-alive task to revoke and stop.
    _stop: oneshot::Sender<()>,
}

/// Called with the lease id when a session is retired.
pub(crate) type RetireHook = Arc<dyn Fn(i64) + Send + Sync>;

/// Requests to the keep-alive task.
enum Control {
    /// Stop renewing: the lease then runs out its TTL. With `confirm`, renew once more
    /// first, so that the TTL counts from now; `done` is answered when that is settled.
    StopRenewing {
        confirm: bool,
        done: oneshot::Sender<()>,
    },
}

impl std::fmt::Debug for SessionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease_id", &format_args!("{:x}", self.lease_id))
            .field("ttl", &self.ttl)
            .field("lost", &self.loss.current())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds) and starts the task that
    /// keeps it alive. A session for a lock without renewal is renewed only while its
    /// acquisition waits ([`stop_renewing`](SessionInner::stop_renewing) ends that at the
    /// grant), so that the lock's TTL counts from the grant, not from the queueing.
    #[tracing::instrument(
        skip(client, kv, renewal, config, hub, on_retire),
        fields(backend = "etcd")
    )]
    pub(crate) async fn open(
        client: Client,
        kv: KvClient,
        renewal: TokenRenewal,
        config: Arc<EtcdConfig>,
        ttl: Duration,
        hub: Arc<WatchHub>,
        on_retire: Option<RetireHook>,
    ) -> Result<Self, LockError> {
        let timeout = config.request_timeout;
        let (lease_id, ttl, clock) = grant(&client, &renewal, &config, ttl).await?;
        let (notifier, loss) = loss_channel(Backend::Etcd);
        let notifier = Arc::new(notifier);
        let (stop_tx, stop_rx) = oneshot::channel();
        let (control, control_rx) = mpsc::unbounded_channel();

        let task = KeepAlive {
            client: client.clone(),
            renewal: renewal.clone(),
            lease_id,
            ttl,
            timeout,
            config: config.clone(),
            notifier: notifier.clone(),
            loss: loss.clone(),
            clock: clock.clone(),
            failures: 0,
        };
        let span = tracing::info_span!("etcd session", lease_id = format_args!("{lease_id:x}"));
        // The report is made here and moved in: a task dropped before it was first polled
        // (its runtime shut down at once) reports the loss too.
        let report = ReportOnStop(notifier.clone());
        tokio::spawn(task.run(stop_rx, control_rx, report).instrument(span));
        tracing::debug!(lease_id, ?ttl, "session opened");

        let batch = super::batch::Batcher::new(
            kv.clone(),
            renewal.clone(),
            timeout,
            config.max_batch,
            config.max_in_flight,
        );
        Ok(Self {
            inner: Arc::new(SessionInner {
                kv,
                client,
                renewal,
                config,
                lease_id,
                ttl,
                slots: super::slots::Slots::default(),
                notifier,
                loss,
                clock,
                hub,
                retired: std::sync::atomic::AtomicBool::new(false),
                on_retire,
                late_joins: super::late_joins::LateJoins::default(),
                batch,
                control,
                _stop: stop_tx,
            }),
        })
    }

    /// The lease id; every lock key of this session is attached to it.
    #[must_use]
    pub fn lease_id(&self) -> i64 {
        self.inner.lease_id
    }

    /// The TTL the server granted.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// `false` once the lease is known lost or its local deadline has passed.
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }

    /// Resolves when the lease is lost, with the reason.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.inner.lost().await
    }

    /// Revokes the lease (deleting every lock key of this session at once) and tells
    /// every guard that the session is closed.
    #[tracing::instrument(skip(self), fields(backend = "etcd", lease_id = self.inner.lease_id))]
    pub async fn close(&self) -> Result<(), LockError> {
        // Mark first: from now on no guard of this session may believe it holds a lock.
        self.inner.notifier.mark(LossReason::Closed);
        let inner = &self.inner;
        revoke(&inner.client, &inner.renewal, inner.lease_id, &inner.config).await
    }
}

/// Grants a lease of `ttl` (rounded up to whole seconds): its id, its TTL, and its local
/// deadline, counted from when the grant was sent (the server's TTL runs from some moment
/// after that).
///
/// A grant answered so late that too little of that deadline is left to confirm a
/// renewal ([`too_late`]: it waited behind a slow member or a partition with a request
/// timeout longer than the TTL, or was retried after a timeout) is of no use: every lock
/// taken under it would come out lost. Such a lease is revoked in the background and
/// granted again, once; a second late grant ends the call with a timeout
/// (`late_lease_grant.rs`). Opening a session can so take two grants' worth of retries.
async fn grant(
    client: &Client,
    renewal: &TokenRenewal,
    config: &Arc<EtcdConfig>,
    ttl: Duration,
) -> Result<(i64, Duration, Arc<LeaseClock>), LockError> {
    let timeout = config.request_timeout;
    let seconds = i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
    let started = Clock::BOOT.now();
    let mut late = false;
    loop {
        let sent = Clock::BOOT.now();
        // A retried grant can at worst leave an unused lease to run out.
        let grant = call_retrying("lease grant", None, timeout, renewal, || {
            let mut client = client.clone();
            async move { client.lease_grant(seconds, None).await }
        })
        .await?;
        let granted = u64::try_from(grant.ttl())
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| malformed("lease grant", None, "non-positive TTL"))?;
        let ttl = Duration::from_secs(granted);
        let lease_id = grant.id();
        let clock = Arc::new(LeaseClock::new(Clock::BOOT, sent + ttl));
        let left = clock.remaining();
        if !too_late(ttl, left) {
            return Ok((lease_id, ttl, clock));
        }
        tracing::warn!(
            lease_id,
            ?ttl,
            ?left,
            "lease grant answered too late to be renewed; revoking it"
        );
        let (client, renewal, config) = (client.clone(), renewal.clone(), config.clone());
        tokio::spawn(
            async move {
                if let Err(err) = revoke(&client, &renewal, lease_id, &config).await {
                    tracing::debug!(%err, lease_id, "revoking a late grant failed");
                }
            }
            .in_current_span(),
        );
        if late {
            return Err(LockError::Timeout {
                backend: Backend::Etcd,
                operation: "lease grant",
                lock: None,
                after: Clock::BOOT.now().saturating_duration_since(started),
            });
        }
        late = true;
    }
}

/// Whether a lease of `ttl` whose deadline is `left` away is of no use: less is left
/// than a renewal may wait for its answer, so none could be confirmed in time.
fn too_late(ttl: Duration, left: Duration) -> bool {
    left < answer_wait(ttl / 3)
}

/// Whether a renewal is due at once, rather than a renewal interval from now: less than
/// two intervals are left, so waiting one would leave less than one to confirm it (a
/// grant answered late; a fresh grant leaves about three).
fn needs_renewal_now(interval: Duration, left: Duration) -> bool {
    left < interval * 2
}

/// Revokes `lease_id`, trying another member when one refuses or does not answer (a
/// revoke applied twice finds the lease gone, which is what revoking wanted).
async fn revoke(
    client: &Client,
    renewal: &TokenRenewal,
    lease_id: i64,
    config: &EtcdConfig,
) -> Result<(), LockError> {
    let revoked = call_retrying(
        "lease revoke",
        None,
        config.request_timeout,
        renewal,
        || {
            let mut client = client.clone();
            async move { client.lease_revoke(lease_id).await }
        },
    )
    .await;
    match revoked {
        Ok(_) => Ok(()),
        // Already gone on the server: what closing wanted.
        Err(LockError::Backend { source, .. })
            if source.to_string().contains("requested lease not found") =>
        {
            Ok(())
        }
        Err(err) => Err(err),
    }
}

impl SessionInner {
    pub(crate) fn lease_id(&self) -> i64 {
        self.lease_id
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.loss.current().is_none() && !self.clock.has_passed()
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.loss
            .current()
            .or_else(|| self.clock.has_passed().then_some(LossReason::Expired))
    }

    /// How long the lease is certainly still ours by this machine's clock (suspend
    /// included); zero once it is lost or its time has run out.
    pub(crate) fn remaining(&self) -> Duration {
        if self.loss.current().is_some() {
            return Duration::ZERO;
        }
        self.clock.remaining()
    }

    /// Takes the session out of use for new acquisitions; see `retired`.
    pub(crate) fn retire(&self) {
        if !self.retired.swap(true, Ordering::AcqRel) {
            if let Some(hook) = &self.on_retire {
                hook(self.lease_id);
            }
        }
    }

    /// Whether new acquisitions may use this session.
    pub(crate) fn is_usable(&self) -> bool {
        self.is_alive() && !self.retired.load(Ordering::Acquire)
    }

    /// Ends renewal: from now on the lease runs out its TTL. With `confirm`, or when less
    /// than two renewal intervals are left, one more renewal is made first, so that the
    /// TTL counts from now (a lock without renewal that waited in line, or whose grant was
    /// answered late, gets its whole TTL from the grant).
    pub(crate) async fn stop_renewing(&self, confirm: bool) {
        let (done, settled) = oneshot::channel();
        if self
            .control
            .send(Control::StopRenewing { confirm, done })
            .is_ok()
        {
            // An error means the task has ended: the lease is lost or closed, and the
            // guard reports that by itself.
            let _ = settled.await;
        }
    }

    pub(crate) async fn lost(&self) -> LossReason {
        self.loss.wait().await
    }

    /// Asks etcd whether the lease still exists (`LeaseTimeToLive`), after one of its keys
    /// was found deleted: a revoked lease deletes its keys, and the watch may show that
    /// before the keep-alive does. Marks the session lost (revoked) if the lease is gone;
    /// returns whether it is. An unanswered check says nothing: the keep-alive will tell.
    pub(crate) async fn lease_gone(&self) -> bool {
        if self.loss.current().is_some() {
            return true;
        }
        let timeout = self.config.request_timeout;
        let asked = call_renewing("lease check", None, timeout, &self.renewal, || {
            let mut lease = self.client.lease_client();
            async move { lease.time_to_live(self.lease_id, None).await }
        })
        .await;
        match asked {
            // etcd answers -1 for a lease it does not know.
            Ok(answer) if answer.ttl() < 0 => {
                self.notifier.mark(LossReason::Revoked);
                true
            }
            Err(LockError::Backend { source, .. })
                if source.to_string().contains("requested lease not found") =>
            {
                self.notifier.mark(LossReason::Revoked);
                true
            }
            _ => false,
        }
    }

    /// Starts a guard's hold on this session's lease (metrics, and the count of locks a
    /// loss of the lease costs).
    pub(crate) fn holding(&self) -> crate::metrics::Holding {
        self.loss.holding()
    }
}

/// The background task behind one session's lease.
struct KeepAlive {
    client: Client,
    renewal: TokenRenewal,
    lease_id: i64,
    ttl: Duration,
    timeout: Duration,
    config: Arc<EtcdConfig>,
    notifier: Arc<LossNotifier>,
    loss: LossWatch,
    clock: Arc<LeaseClock>,
    /// Renewal attempts that failed or went unanswered since the last confirmed one.
    failures: u32,
}

/// A keep-alive stream and the send time of its one outstanding request, if any.
struct Stream {
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    /// When the unanswered keep-alive was sent: on the lease's clock, and for the timers.
    outstanding: Option<(ClockInstant, Instant)>,
    /// The connection of its own the stream was opened on after a failure, kept open for
    /// as long as the stream is used.
    _own: Option<Client>,
}

/// A [`backoff`] pause drawn between half and all of it: many clients that lost
/// the same member (a leader election) do not reconnect, and authenticate, in lockstep.
fn jittered(pause: Duration) -> Duration {
    use std::hash::BuildHasher;
    // A fresh RandomState is keyed anew: its hash of anything is a random number.
    let draw = std::collections::hash_map::RandomState::new().hash_one(pause);
    let half = pause / 2;
    #[allow(clippy::cast_precision_loss)]
    let extra = half.mul_f64((draw % 1000) as f64 / 1000.0);
    half + extra
}

/// Reports the lease lost ([`LossReason::Unrenewed`]) when the keep-alive task's future
/// is dropped without having reported how it ended: a panic in it (a bug, or a metrics
/// recorder that panics while a renewal is counted), an abort, the runtime shutting
/// down, a runtime gone before the task was first polled; also while it waits out a
/// lease no longer renewed (`expire`, its TTL still running): on the safe side. Every
/// other end marks its reason first (the first reason wins, so this is then a no-op).
/// Without it, a dead task renews nothing and reports nothing: the lease runs out on the
/// server while `lost()` waits for ever.
struct ReportOnStop(Arc<LossNotifier>);

impl Drop for ReportOnStop {
    fn drop(&mut self) {
        // `mark` catches a panicking recorder: no second panic during an unwind.
        self.0.mark(LossReason::Unrenewed);
    }
}

impl KeepAlive {
    /// Renews every TTL/3 until the session is dropped or closed, the lease is lost, or
    /// renewal is stopped (then the lease runs out its TTL). A keep-alive that fails or
    /// gets no answer within [`answer_wait`] (a third of the interval, 250 ms to 1 s: a
    /// healthy leader renews in memory, without a Raft round, `LeaseRenew`) is retried at once on a fresh stream, then
    /// with a short backoff, each retry on connections of its own to every member.
    async fn run(
        mut self,
        mut stop: oneshot::Receiver<()>,
        mut control: mpsc::UnboundedReceiver<Control>,
        _report: ReportOnStop,
    ) {
        let interval = self.ttl / 3;
        let answer_wait = answer_wait(interval);
        let mut stream: Option<Stream> = None;
        let loss = self.loss.clone();
        let clock = self.clock.clone();
        // The first renewal comes a third of the TTL after the grant, or at once if the
        // grant's answer took long: its deadline counts from the grant's sending, and a
        // renewal must be confirmed before it (`late_lease_grant.rs`).
        let first = if needs_renewal_now(interval, clock.remaining()) {
            Duration::ZERO
        } else {
            interval
        };
        let mut next_send = Instant::now() + first;
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => return self.revoke().await,
                _ = loss.wait() => return,
                () = clock.passed() => {
                    tracing::warn!("no renewal confirmed before the lease ran out");
                    return self.revoke_expired().await;
                }
                Some(Control::StopRenewing { confirm, done }) = control.recv() => {
                    // Also when less than two intervals are left: a grant answered late
                    // whose first renewal (sent at once) failed or is still unanswered
                    // (`late_lease_grant.rs`). Decided now, after any renewal this task
                    // already made, so a confirmed one is not made twice.
                    if confirm || needs_renewal_now(interval, clock.remaining()) {
                        if let Err(why) = self.reopen(answer_wait).await {
                            // The lease keeps the deadline of its last confirmed renewal.
                            tracing::debug!(?why, "last renewal before stopping failed");
                        }
                    }
                    drop(stream);
                    let _ = done.send(());
                    return self.expire(stop).await;
                }
                reply = next_reply(&mut stream) => match reply {
                    Reply::Renewed(sent, sent_at) => {
                        crate::metrics::renewals(Backend::Etcd, 1, 0);
                        self.clock.extend_to(sent + self.ttl);
                        self.failures = 0;
                        next_send = sent_at + interval;
                    }
                    Reply::Gone => {
                        tracing::warn!("server reports the lease is gone");
                        return self.notifier.mark(LossReason::Revoked);
                    }
                    Reply::Broken(why) => {
                        crate::metrics::renewals(Backend::Etcd, 0, 1);
                        tracing::debug!(%why, "keep-alive stream broke; reopening");
                        stream = None;
                        next_send = self.failed(answer_wait);
                    }
                },
                _ = tokio::time::sleep_until(next_send) => {
                    match &mut stream {
                        // Unanswered for `answer_wait`: the member is stalled or cut off.
                        // Give up on it and reopen, which goes to another member.
                        Some(s) if s.outstanding.is_some() => {
                            crate::metrics::renewals(Backend::Etcd, 0, 1);
                            tracing::debug!(?answer_wait, "keep-alive unanswered; reopening");
                            self.failures += 1;
                            stream = None;
                        }
                        Some(s) => {
                            let sent = (self.clock.now(), Instant::now());
                            if s.keeper.keep_alive().await.is_ok() {
                                s.outstanding = Some(sent);
                                next_send = sent.1 + answer_wait;
                            } else {
                                self.failures += 1;
                                stream = None;
                            }
                        }
                        None => {}
                    }
                    if stream.is_none() {
                        match self.reopen(answer_wait).await {
                            Ok(s) => {
                                crate::metrics::renewals(Backend::Etcd, 1, 0);
                                self.failures = 0;
                                stream = Some(s);
                                next_send = Instant::now() + interval;
                            }
                            Err(Reopen::Gone) => {
                                tracing::warn!("server reports the lease is gone");
                                return self.notifier.mark(LossReason::Revoked);
                            }
                            Err(Reopen::Failed(why)) => {
                                crate::metrics::renewals(Backend::Etcd, 0, 1);
                                tracing::debug!(%why, failures = self.failures, "could not reopen keep-alive stream");
                                next_send = self.failed(answer_wait);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Without renewal: the lease is trusted until its TTL runs out, then lost.
    async fn expire(self, mut stop: oneshot::Receiver<()>) {
        let loss = self.loss.clone();
        let clock = self.clock.clone();
        tokio::select! {
            _ = &mut stop => self.revoke().await,
            _ = loss.wait() => {}
            () = clock.passed() => self.revoke_expired().await,
        }
    }

    /// Counts one more failed attempt and returns when to make the next: after a
    /// jittered [`backoff`], never more than `answer_wait`.
    fn failed(&mut self, answer_wait: Duration) -> Instant {
        self.failures += 1;
        Instant::now() + jittered(backoff(self.failures, answer_wait))
    }

    /// Opens a keep-alive stream; opening sends one keep-alive and waits for its answer,
    /// never longer than `answer_wait` and never past the lease's deadline, so that the
    /// loss is reported on time.
    ///
    /// After a failure it opens the stream on connections of its own to every member at
    /// once and keeps the first that answers, not on the shared client: that client's
    /// balancer picks a member at random for every call (tonic's `p2c` with a constant
    /// load), so it can send retry after retry to the member that stalled, and its
    /// connection to a member may be a dead one that HTTP/2 keep-alive pings will only
    /// find out about seconds later.
    async fn reopen(&mut self, answer_wait: Duration) -> Result<Stream, Reopen> {
        let sent = self.clock.now();
        let limit = self.timeout.min(self.clock.remaining()).min(answer_wait);
        let opening = async {
            if self.failures == 0 {
                let mut client = self.client.clone();
                let (keeper, responses) = client
                    .lease_keep_alive(self.lease_id)
                    .await
                    .map_err(Reopen::from)?;
                return Ok((None, keeper, responses));
            }
            // A set of tasks, aborted when dropped: the slower attempts end with the first
            // answer, or with the time limit.
            let mut attempts = tokio::task::JoinSet::new();
            for member in 0..self.config.endpoints.len() {
                let (config, lease_id) = (self.config.clone(), self.lease_id);
                attempts.spawn(async move {
                    let mut client = own_connection(&config, member).await?;
                    let (keeper, responses) = client.lease_keep_alive(lease_id).await?;
                    Ok::<_, etcd_client::Error>((Some(client), keeper, responses))
                });
            }
            let mut failed = Reopen::Failed("no endpoints".into());
            while let Some(attempt) = attempts.join_next().await {
                let Ok(attempt) = attempt else { continue };
                match attempt.map_err(Reopen::from) {
                    Ok(opened) => return Ok(opened),
                    Err(Reopen::Gone) => return Err(Reopen::Gone),
                    Err(err) => failed = err,
                }
            }
            Err(failed)
        };
        match tokio::time::timeout(limit, opening).await {
            Ok(Ok((own, keeper, responses))) => {
                self.clock.extend_to(sent + self.ttl);
                Ok(Stream {
                    keeper,
                    responses,
                    outstanding: None,
                    _own: own,
                })
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(Reopen::Failed(format!("no answer within {limit:?}"))),
        }
    }

    /// The lease ran out by the local clock: every guard is told it is lost, then the
    /// lease is revoked (best effort). The server may keep it longer: renewals it applied
    /// whose answers never came, a new leader that extends every lease by its TTL
    /// (`lessor.Promote`), its own expiry check every 500 ms. Meanwhile its keys, held
    /// by nobody, would block their locks. Safe: the session takes no acquisition once
    /// its lease has passed, and a join in flight carrying a revoked lease fails whole
    /// (`apply.go` `checkRequestPut`).
    async fn revoke_expired(self) {
        self.notifier.mark(LossReason::Expired);
        match revoke(&self.client, &self.renewal, self.lease_id, &self.config).await {
            Ok(()) => tracing::debug!("expired lease revoked"),
            Err(err) => tracing::debug!(%err, "expired lease not revoked; the server expires it"),
        }
    }

    /// Best effort: the lease dies by its TTL anyway if this does not get through.
    async fn revoke(self) {
        self.notifier.mark(LossReason::Closed);
        match revoke(&self.client, &self.renewal, self.lease_id, &self.config).await {
            Ok(()) => tracing::debug!("lease revoked"),
            Err(err) => tracing::debug!(%err, "lease revoke failed"),
        }
    }
}

/// A client of its own to the member at index `member` of the configured endpoints, with
/// the configured credentials and TLS.
async fn own_connection(config: &EtcdConfig, member: usize) -> Result<Client, etcd_client::Error> {
    let tls = config
        .loaded_tls()
        .map_err(|err| etcd_client::Error::InvalidArgs(err.to_string()))?;
    let endpoint = config
        .endpoints
        .get(member)
        .ok_or_else(|| etcd_client::Error::InvalidArgs("no endpoints".into()))?;
    Client::connect([endpoint], Some(config.connect_options(tls.as_ref()))).await
}

enum Reply {
    Renewed(ClockInstant, Instant),
    Gone,
    Broken(String),
}

#[derive(Debug)]
enum Reopen {
    Gone,
    Failed(String),
}

impl From<etcd_client::Error> for Reopen {
    fn from(err: etcd_client::Error) -> Self {
        match err {
            etcd_client::Error::LeaseKeepAliveError(msg) if msg.contains("not found") => Self::Gone,
            err => Self::Failed(err.to_string()),
        }
    }
}

/// The next answer on the stream, if a request is outstanding; otherwise never resolves.
async fn next_reply(stream: &mut Option<Stream>) -> Reply {
    let Some(s) = stream else {
        return std::future::pending().await;
    };
    let Some(sent) = s.outstanding else {
        return std::future::pending().await;
    };
    match s.responses.message().await {
        Ok(Some(resp)) if resp.ttl() > 0 => {
            s.outstanding = None;
            Reply::Renewed(sent.0, sent.1)
        }
        Ok(Some(_)) => Reply::Gone,
        Ok(None) => Reply::Broken("stream ended".into()),
        Err(err) => Reply::Broken(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jittered_pauses_fall_between_half_and_all_and_differ() {
        let pause = Duration::from_millis(400);
        let drawn: Vec<Duration> = (0..50).map(|_| jittered(pause)).collect();
        assert!(drawn.iter().all(|d| *d >= pause / 2 && *d <= pause));
        let first = drawn[0];
        assert!(drawn.iter().any(|d| *d != first), "no two draws differ");
    }

    #[test]
    fn a_grant_is_too_late_when_no_renewal_could_be_confirmed_in_time() {
        let ttl = Duration::from_secs(6);
        // A renewal of a 6 s lease waits at most 667 ms for its answer.
        assert!(too_late(ttl, Duration::ZERO));
        assert!(too_late(ttl, Duration::from_millis(600)));
        assert!(!too_late(ttl, Duration::from_millis(700)));
        assert!(!too_late(ttl, ttl));
        // The wait is never under 250 ms, however short the TTL.
        assert!(too_late(Duration::from_secs(1), Duration::from_millis(249)));
    }

    #[test]
    fn a_late_grant_is_renewed_at_once_a_fresh_one_after_an_interval() {
        let interval = Duration::from_secs(2);
        assert!(!needs_renewal_now(interval, Duration::from_millis(5_990)));
        assert!(!needs_renewal_now(interval, Duration::from_secs(4)));
        assert!(needs_renewal_now(interval, Duration::from_millis(3_999)));
        assert!(needs_renewal_now(interval, Duration::from_millis(1)));
    }
}
