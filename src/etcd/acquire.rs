//! Taking an etcd lock: one transaction to join the queue, then FIFO waiting by watch.
//!
//! The join runs in the caller's future: an uncontended lock costs no task. Until the join
//! has an answer, a [`Cleanup`] is armed: if the caller's future is dropped then, it
//! retires the session (the join may still land) and removes the key in the background. A
//! wait runs in a task of its own, which the caller awaits: if the caller goes away
//! meanwhile (its future dropped or timed out) the task notices and removes its key; if a
//! grant races with the drop, the guard that nobody receives releases the lock as it is
//! dropped.
//!
//! A key that leaves the queue without the lock (a `try_lock` miss, a wait timeout, an
//! error, a dropped call) is removed before the caller is answered, or, if etcd does not
//! confirm the removal within [`CLEANUP_ALLOWANCE`], in the background, retried until etcd
//! confirms it or the session is gone. What every request about the key may and may not
//! do, and why, is in `key_life.rs`.
//!
//! From the join on, the key is followed on the lock's watch (`watch_hub.rs`): a waiter
//! hears the deletions ahead of it, and a holder hears of its own key's deletion.

use std::sync::Arc;

use etcd_client::{GetOptions, GetResponse};
use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use super::call::call_retrying;
use super::guard::EtcdGuard;
use super::key_life::{Cleanup, Joined, QueueKey};
use super::kind::Kind;
use super::queue::{Ahead, Place};
use super::session::Session;
use super::watch_hub::{Subscription, TrackedKey, WatchHub};
use crate::{FencingToken, LockError, LossReason};

/// How long a caller's answer waits for its queue key to be removed; see the module docs.
/// A wait timeout returns at most this much later than the timeout.
pub(crate) const CLEANUP_ALLOWANCE: Duration = Duration::from_millis(250);

/// Whether to wait for the lock, and until when.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// Return at once if someone is ahead of us.
    Try,
    /// Wait in line; `timeout` bounds the whole acquisition, counted from its start.
    Wait { timeout: Option<Duration> },
}

/// Runs one acquisition and returns its outcome.
///
/// `owns_session`: the session was opened for this lock alone (no renewal) and ends with it.
/// `kind`: what the key stands for, which decides when it is admitted (see `kind.rs`);
/// `value`: what its key holds (the kind's marker, and the holder record).
/// `started`: when the caller's call began; a wait timeout counts from it.
pub(crate) async fn acquire(
    session: Session,
    owns_session: bool,
    name: &str,
    mode: Mode,
    kind: Kind,
    value: Vec<u8>,
    started: Instant,
) -> Result<Option<EtcdGuard>, LockError> {
    let hub = session.inner.hub.clone();
    let key = QueueKey::take(session, name, value);
    // If this client follows this lock already (a recent wait or grant), its watch is open
    // and synced: followed before the join, the join's own read is all a wait needs, and a
    // grant needs no read to know its key's deletions will reach it.
    let early = match mode {
        Mode::Wait { .. } if hub.is_open(key.prefix()) => Some(hub.subscribe(key.prefix())),
        _ => None,
    };
    let tracked = hub.track(key.prefix(), &key.key);
    let acquisition = Acquisition::new(hub, owns_session, started, kind);
    let mut cleanup = Cleanup::joining(key);
    let joined = match cleanup.key_mut() {
        Some(key) => acquisition.enqueue(key).await,
        None => return Err(internal(name, "the queue key went missing")),
    };
    let (token, place, revision) = match joined {
        Ok(joined) => joined,
        Err(err) => {
            let unknown = cleanup.key().is_some_and(QueueKey::join_unknown);
            if unknown {
                // No answer does not mean not applied, now or later: see `key_life.rs`.
                tracing::debug!(%err, "join failed without an answer");
                return acquisition.leave(cleanup, Err(err)).await;
            }
            // Refused: nothing was written.
            if let Some(key) = cleanup.disarm() {
                key.give_back();
            }
            return Err(err);
        }
    };
    cleanup.created();
    let gone = tracked
        .as_ref()
        .is_some_and(|t| t.settle(token.as_revision()));
    match (place, mode) {
        (Place::Gone, _) => {
            let lost = match cleanup.key() {
                Some(key) => {
                    acquisition
                        .key_gone_checked(key, Some((token, revision)))
                        .await
                }
                None => acquisition.key_gone(None),
            };
            acquisition.leave(cleanup, Err(lost)).await
        }
        _ if gone => {
            let lost = match cleanup.key() {
                Some(key) => acquisition.key_gone_checked(key, None).await,
                None => acquisition.key_gone(None),
            };
            acquisition.leave(cleanup, Err(lost)).await
        }
        (Place::Head, _) => match cleanup.disarm() {
            Some(key) => Ok(Some(
                acquisition
                    .grant(key, tracked, token, revision, false)
                    .await?,
            )),
            None => Err(internal(name, "the queue key went missing")),
        },
        (Place::Behind(_), Mode::Try) => acquisition.leave(cleanup, Ok(None)).await,
        (Place::Behind(ahead), Mode::Wait { timeout }) => {
            // The waiting task owns the key from here on.
            let Some(key) = cleanup.disarm() else {
                return Err(internal(name, "the queue key went missing"));
            };
            let (reply, answer) = oneshot::channel();
            let wait = Wait {
                token,
                known: (ahead, revision),
                early,
                tracked,
                timeout,
            };
            let span = tracing::Span::current();
            tokio::spawn(acquisition.wait(key, wait, reply).instrument(span));
            answer.await.unwrap_or_else(|_| {
                Err(internal(
                    name,
                    "the acquisition task stopped (runtime shutting down?)",
                ))
            })
        }
    }
}

pub(super) fn internal(name: &str, what: &'static str) -> LockError {
    LockError::Backend {
        backend: crate::Backend::Etcd,
        operation: "acquire",
        lock: Some(name.to_owned()),
        source: what.into(),
    }
}

/// What a wait starts from.
pub(super) struct Wait {
    pub(super) token: FencingToken,
    /// The keys ahead, and the revision they were read at.
    pub(super) known: (Ahead, i64),
    /// A subscription to the lock's watch taken before the join, if it was open: only
    /// then is the join's read a starting point.
    pub(super) early: Option<Subscription>,
    /// The key followed on the lock's watch, if it was open before the join.
    pub(super) tracked: Option<TrackedKey>,
    pub(super) timeout: Option<Duration>,
}

/// Where a waiting task answers: dropped, it tells the task its caller is gone.
pub(super) type Reply = oneshot::Sender<Result<Option<EtcdGuard>, LockError>>;

/// One acquisition's settings, beside its key.
pub(super) struct Acquisition {
    pub(super) hub: Arc<WatchHub>,
    owns_session: bool,
    started: Instant,
    pub(super) kind: Kind,
}

impl Acquisition {
    /// The settings of one acquisition of `kind` begun at `started` (`owns_session`: its
    /// session serves it alone, and stops renewing at the grant).
    pub(super) fn new(
        hub: Arc<WatchHub>,
        owns_session: bool,
        started: Instant,
        kind: Kind,
    ) -> Self {
        Self {
            hub,
            owns_session,
            started,
            kind,
        }
    }

    /// What a read of the queue must return for this kind: every key, with its value
    /// where the kind looks at values (readers, permits).
    pub(super) fn queue_read(&self) -> GetOptions {
        let read = GetOptions::new();
        match self.kind {
            Kind::Reader | Kind::Permit { .. } => read,
            Kind::Mutex | Kind::Writer | Kind::Candidate { .. } => read.with_keys_only(),
        }
    }

    /// Joins the queue: the key, and every key ahead of it in the same revision. Returns
    /// the token, the place, and the revision the place was read at.
    async fn enqueue(&self, key: &mut QueueKey) -> Result<(FencingToken, Place, i64), LockError> {
        match key.create(self.queue_read()).await? {
            Joined::Now { token, read } => {
                Ok((token, self.place(token, read.kvs()), token.as_revision()))
            }
            // An earlier attempt of the join went through: read the place now.
            Joined::Earlier(token) => self
                .read_place(key, token)
                .await
                .map(|(place, revision)| (token, place, revision)),
        }
    }

    /// The guard for a grant on `key`, seen alive at `revision`; `waited` says whether it
    /// queued first (a lock without renewal then renews once more, so that its TTL counts
    /// from now). The key is followed from now on (on the lock's watch, opened from the
    /// revision after the grant if there is none).
    pub(super) async fn grant(
        self,
        key: QueueKey,
        tracked: Option<TrackedKey>,
        token: FencingToken,
        revision: i64,
        waited: bool,
    ) -> Result<EtcdGuard, LockError> {
        let holding = key.inner().holding();
        let on_lost = decide_loss(&key, holding.loss());
        let tracked = match tracked {
            Some(tracked) => {
                tracked.hold(revision, on_lost);
                tracked
            }
            None => self
                .hub
                .hold(key.prefix(), &key.key, token.as_revision(), on_lost),
        };
        tracing::debug!(%token, waited, "lock acquired");
        if self.owns_session {
            key.inner().stop_renewing(waited).await;
        }
        Ok(EtcdGuard::new(
            key,
            self.owns_session,
            tracked,
            token,
            revision,
            holding,
        ))
    }

    /// Waits in line (in its own task), then answers through `reply`; if `reply` is
    /// dropped first, leaves the queue (a grant that races with that is released as the
    /// guard nobody receives is dropped).
    pub(super) async fn wait(self, key: QueueKey, wait: Wait, mut reply: Reply) {
        let Wait {
            token,
            known,
            early,
            tracked,
            timeout,
        } = wait;
        let deadline = timeout.map(|t| self.started + t);
        let mut cleanup = Cleanup::joined(key);
        let Some(key) = cleanup.key() else {
            return;
        };
        let name = key.name().to_owned();
        let mut tracked = tracked;
        // The join's read is a starting point only if the subscription was in place before
        // it: a subscription made now may miss deletions dispatched in between, so the
        // wait reads again once it is in place.
        let (watch, known) = match early {
            Some(watch) => (watch, Some(known)),
            None => (self.hub.subscribe(key.prefix()), None),
        };
        let waiting = self.wait_in_line(key, token, known, watch, &mut tracked);
        let outcome = tokio::select! {
            waited = waiting => Some(waited),
            _ = key.inner().lost() => Some(Err(self.key_gone(Some(key)))),
            _ = sleep_until_opt(deadline) => Some(Err(LockError::WaitTimeout {
                name: name.clone(),
                waited: timeout.unwrap_or_default(),
            })),
            _ = reply.closed() => None,
        };
        let Some(outcome) = outcome else {
            tracing::debug!("caller gave up waiting; leaving the queue");
            drop(tracked);
            // Nobody waits for an answer: the removal may take as long as it needs.
            if let Some(key) = cleanup.disarm() {
                key.remove().await;
            }
            return;
        };
        match outcome {
            Ok(revision) => match cleanup.disarm() {
                Some(key) => {
                    // If the caller is gone, the guard comes back and its drop releases.
                    let granted = self.grant(key, tracked, token, revision, true).await;
                    let _ = reply.send(granted.map(Some));
                }
                None => {
                    let _ = reply.send(Err(internal(&name, "the queue key went missing")));
                }
            },
            Err(err) => {
                drop(tracked);
                let answer = self.leave(cleanup, Err(err)).await;
                let _ = reply.send(answer);
            }
        }
    }

    /// The lock's keys up to `token` (create revision at most the token), as `options`
    /// asks: one read that answers where the key stands.
    pub(super) async fn read_up_to(
        &self,
        key: &QueueKey,
        token: FencingToken,
        options: GetOptions,
    ) -> Result<GetResponse, LockError> {
        let inner = key.inner();
        let options = options
            .with_prefix()
            .with_max_create_revision(token.as_revision());
        call_retrying(
            "wait",
            Some(key.name()),
            inner.config.request_timeout,
            &inner.renewal,
            || {
                let mut client = inner.kv.clone();
                let options = options.clone();
                async move { client.get(&**key.prefix(), Some(options)).await }
            },
        )
        .await
    }

    /// The error for an acquisition whose key went (`at`, if known: the key's token and
    /// the revision it was seen gone at): the lease's loss if it is lost (asking etcd
    /// first: a revoked lease's keys may be seen gone before the keep-alive hears of it),
    /// else the key was deleted under a live lease.
    pub(super) async fn key_gone_checked(
        &self,
        key: &QueueKey,
        at: Option<(FencingToken, i64)>,
    ) -> LockError {
        #[cfg(feature = "testkit")]
        if let Some((token, revision)) = at {
            super::observed::concluded_gone(key.key.as_bytes(), token.as_revision(), revision);
        }
        #[cfg(not(feature = "testkit"))]
        let _ = at;
        // Boxed, as the removal in `leave`: a rare path kept out of every acquisition's
        // future (see `call.rs` on what large futures cost).
        Box::pin(key.inner().lease_gone()).await;
        self.key_gone(Some(key))
    }

    /// [`key_gone_checked`](Self::key_gone_checked), without asking etcd.
    pub(super) fn key_gone(&self, key: Option<&QueueKey>) -> LockError {
        let reason = key
            .and_then(|key| key.inner().loss_reason())
            .unwrap_or(LossReason::KeyDeleted);
        LockError::LeaseLost {
            lock: key.map(|key| key.name().to_owned()),
            reason,
        }
    }

    /// Removes the key `cleanup` is armed for, then returns `answer`; see the module docs
    /// for what happens when etcd does not confirm the removal within
    /// [`CLEANUP_ALLOWANCE`]. If this future is dropped meanwhile, `cleanup` goes on in
    /// the background.
    async fn leave(
        &self,
        cleanup: Cleanup,
        answer: Result<Option<EtcdGuard>, LockError>,
    ) -> Result<Option<EtcdGuard>, LockError> {
        // Boxed: leaving the queue is the path of a miss or a failure, and its future
        // (a delete, retried, under a deadline) would otherwise sit in every
        // acquisition's future, copied from frame to frame on every grant.
        Box::pin(cleanup.leave(CLEANUP_ALLOWANCE)).await;
        answer
    }
}

/// What a guard's loss of its key is decided by: if the key's lease is gone the session
/// reports the revocation (and counts every lock on it); otherwise the key was deleted on
/// its own, and this one lock is counted lost.
fn decide_loss(key: &QueueKey, counted: crate::metrics::HoldingLoss) -> super::watch_hub::OnLost {
    let session = Arc::downgrade(&key.session.inner);
    Arc::new(move |loss| {
        let (session, counted, decided) = (session.clone(), counted.clone(), loss.clone());
        let decide = async move {
            let revoked = match session.upgrade() {
                Some(inner) => inner.lease_gone().await,
                None => false,
            };
            if !revoked {
                counted.count(LossReason::KeyDeleted);
            }
            decided.decide();
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(decide);
            }
            Err(_) => loss.decide(),
        }
    })
}

/// The store revision a read was made at.
pub(super) fn revision_of(read: &GetResponse) -> i64 {
    read.header().map_or(0, |h| h.revision())
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
