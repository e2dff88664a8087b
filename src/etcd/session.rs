//! The session: one lease per client, kept alive by one task for all of its locks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Client, KvClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use super::EtcdConfig;
use super::call::{call, call_retrying, malformed};
use super::watch_hub::WatchHub;
use crate::lease_clock::{Clock, ClockInstant, LeaseClock};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
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
    #[tracing::instrument(skip(client, config, hub, on_retire), fields(backend = "etcd"))]
    pub(crate) async fn open(
        client: Client,
        config: Arc<EtcdConfig>,
        ttl: Duration,
        hub: Arc<WatchHub>,
        on_retire: Option<RetireHook>,
    ) -> Result<Self, LockError> {
        let timeout = config.request_timeout;
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
        let sent = Clock::BOOT.now();
        // A retried grant can at worst leave an unused lease to run out.
        let grant = call_retrying("lease grant", None, timeout, || {
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
        let (notifier, loss) = loss_channel(Backend::Etcd);
        let notifier = Arc::new(notifier);
        let (stop_tx, stop_rx) = oneshot::channel();
        let (control, control_rx) = mpsc::unbounded_channel();

        let task = KeepAlive {
            client: client.clone(),
            lease_id,
            ttl,
            timeout,
            config: config.clone(),
            notifier: notifier.clone(),
            loss: loss.clone(),
            clock: clock.clone(),
        };
        let span = tracing::info_span!("etcd session", lease_id = format_args!("{lease_id:x}"));
        tokio::spawn(task.run(stop_rx, control_rx).instrument(span));
        tracing::debug!(lease_id, ?ttl, "session opened");

        Ok(Self {
            inner: Arc::new(SessionInner {
                kv: client.kv_client(),
                client,
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
        revoke(&self.inner.client, self.inner.lease_id, &self.inner.config).await
    }
}

/// Revokes `lease_id`, trying another member when one refuses or does not answer (a
/// revoke applied twice finds the lease gone, which is what revoking wanted).
async fn revoke(client: &Client, lease_id: i64, config: &EtcdConfig) -> Result<(), LockError> {
    let revoked = call_retrying("lease revoke", None, config.request_timeout, || {
        let mut client = client.clone();
        async move { client.lease_revoke(lease_id).await }
    })
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

    /// Ends renewal: from now on the lease runs out its TTL. With `confirm`, one more
    /// renewal is made first, so that the TTL counts from now (a lock without renewal that
    /// waited in line gets its whole TTL from the grant).
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
        let mut lease = self.client.lease_client();
        let asked = call(
            "lease check",
            None,
            self.config.request_timeout,
            lease.time_to_live(self.lease_id, None),
        )
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
    lease_id: i64,
    ttl: Duration,
    timeout: Duration,
    config: Arc<EtcdConfig>,
    notifier: Arc<LossNotifier>,
    loss: LossWatch,
    clock: Arc<LeaseClock>,
}

/// A keep-alive stream and the send time of its one outstanding request, if any.
struct Stream {
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    outstanding: Option<ClockInstant>,
}

impl KeepAlive {
    /// Renews every TTL/3 until the session is dropped or closed, the lease is lost, or
    /// renewal is stopped (then the lease runs out its TTL).
    async fn run(
        mut self,
        mut stop: oneshot::Receiver<()>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let interval = self.ttl / 3;
        let mut stream: Option<Stream> = None;
        let mut next_send = Instant::now() + interval;
        let loss = self.loss.clone();
        let clock = self.clock.clone();
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => return self.revoke().await,
                _ = loss.wait() => return,
                () = clock.passed() => {
                    tracing::warn!("no renewal confirmed before the lease ran out");
                    return self.notifier.mark(LossReason::Expired);
                }
                Some(Control::StopRenewing { confirm, done }) = control.recv() => {
                    if confirm {
                        if let Err(why) = self.reopen().await {
                            // The lease keeps the deadline of its last confirmed renewal.
                            tracing::debug!(?why, "last renewal before stopping failed");
                        }
                    }
                    drop(stream);
                    let _ = done.send(());
                    return self.expire(stop).await;
                }
                reply = next_reply(&mut stream) => match reply {
                    Reply::Renewed(sent) => {
                        crate::metrics::renewals(Backend::Etcd, 1, 0);
                        self.clock.extend_to(sent + self.ttl);
                    }
                    Reply::Gone => {
                        tracing::warn!("server reports the lease is gone");
                        return self.notifier.mark(LossReason::Revoked);
                    }
                    Reply::Broken(why) => {
                        crate::metrics::renewals(Backend::Etcd, 0, 1);
                        tracing::debug!(%why, "keep-alive stream broke; reopening");
                        stream = None;
                        next_send = Instant::now() + retry_delay(interval);
                    }
                },
                _ = tokio::time::sleep_until(next_send) => {
                    next_send = Instant::now() + interval;
                    match &mut stream {
                        // An answer overdue by a whole interval: the member is stuck or cut
                        // off. Reopen, which may reach another member.
                        Some(s) if s.outstanding.is_some() => {
                            crate::metrics::renewals(Backend::Etcd, 0, 1);
                            stream = None;
                        }
                        Some(s) => {
                            let sent = self.clock.now();
                            if s.keeper.keep_alive().await.is_ok() {
                                s.outstanding = Some(sent);
                            } else {
                                stream = None;
                            }
                        }
                        None => {}
                    }
                    if stream.is_none() {
                        match self.reopen().await {
                            Ok(s) => {
                                crate::metrics::renewals(Backend::Etcd, 1, 0);
                                stream = Some(s);
                            }
                            Err(Reopen::Gone) => {
                                tracing::warn!("server reports the lease is gone");
                                return self.notifier.mark(LossReason::Revoked);
                            }
                            Err(Reopen::Failed(why)) => {
                                crate::metrics::renewals(Backend::Etcd, 0, 1);
                                tracing::debug!(%why, "could not reopen keep-alive stream");
                                next_send = Instant::now() + retry_delay(interval);
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
            () = clock.passed() => {
                self.notifier.mark(LossReason::Expired);
            }
        }
    }

    /// Opens a keep-alive stream; opening sends one keep-alive and waits for its answer,
    /// but never past the lease's deadline, so that the loss is reported on time.
    async fn reopen(&mut self) -> Result<Stream, Reopen> {
        let sent = self.clock.now();
        let limit = self.timeout.min(self.clock.remaining());
        let opened = tokio::time::timeout(limit, self.client.lease_keep_alive(self.lease_id)).await;
        match opened {
            Ok(Ok((keeper, responses))) => {
                self.clock.extend_to(sent + self.ttl);
                Ok(Stream {
                    keeper,
                    responses,
                    outstanding: None,
                })
            }
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(msg))) if msg.contains("not found") => {
                Err(Reopen::Gone)
            }
            Ok(Err(err)) => Err(Reopen::Failed(err.to_string())),
            Err(_) => Err(Reopen::Failed("timed out".into())),
        }
    }

    /// Best effort: the lease dies by its TTL anyway if this does not get through.
    async fn revoke(self) {
        self.notifier.mark(LossReason::Closed);
        match revoke(&self.client, self.lease_id, &self.config).await {
            Ok(()) => tracing::debug!("lease revoked"),
            Err(err) => tracing::debug!(%err, "lease revoke failed"),
        }
    }
}

enum Reply {
    Renewed(ClockInstant),
    Gone,
    Broken(String),
}

#[derive(Debug)]
enum Reopen {
    Gone,
    Failed(String),
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
            Reply::Renewed(sent)
        }
        Ok(Some(_)) => Reply::Gone,
        Ok(None) => Reply::Broken("stream ended".into()),
        Err(err) => Reply::Broken(err.to_string()),
    }
}

/// Retry soon after a failure, but not in a tight loop.
fn retry_delay(interval: Duration) -> Duration {
    interval.min(Duration::from_millis(200))
}
