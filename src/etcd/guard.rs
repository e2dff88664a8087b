//! The etcd lock guard: token, loss (of the lease or of the key), guarded release,
//! owner-guarded transactions.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};

use super::call::call_renewing;
use super::key_life::{Deleted, QueueKey};
use super::session::Session;
use super::watch_hub::TrackedKey;
use crate::metrics::{self, Holding, Release};
use crate::{Backend, FencingToken, LockError, LockGuard, LossReason, ReleaseOutcome};

/// A held etcd lock.
///
/// Its [`token`](LockGuard::token) is the create revision of its key: strictly larger than
/// the token of every earlier holder of the same lock, across leader failovers too.
/// Ownership is lost when the session's lease is (see [`Session`]) and also when the key
/// itself is deleted under a live lease (an operator, another client's request): the
/// guard follows its key on the lock's watch, shared with every other waiter and holder
/// of the lock in this client, and then reports [`LossReason::KeyDeleted`].
/// Dropping the guard releases the lock in the background (best effort; the lease expires
/// it otherwise).
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct EtcdGuard {
    key: QueueKey,
    owns_session: bool,
    /// The key, followed on the lock's watch until the guard ends.
    tracked: Option<TrackedKey>,
    token: FencingToken,
    /// The store revision the grant was decided at.
    admitted: i64,
    released: bool,
    /// A release's delete was sent: if the guard goes before its answer, that delete may
    /// still land, and the key's name must not be reused.
    releasing: bool,
    /// Ends when the guard is released or dropped, before its session may close (a
    /// closing own session must not count this lock as lost).
    holding: Option<Holding>,
}

impl EtcdGuard {
    pub(super) fn new(
        key: QueueKey,
        owns_session: bool,
        tracked: TrackedKey,
        token: FencingToken,
        admitted: i64,
        holding: Holding,
    ) -> Self {
        Self {
            key,
            owns_session,
            tracked: Some(tracked),
            token,
            admitted,
            released: false,
            releasing: false,
            holding: Some(holding),
        }
    }

    /// The full etcd key of this grant.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key.key
    }

    /// The store revision at which this grant was decided: at that revision the key
    /// existed and the keys ahead of it (create revision below the token) admitted it (none
    /// for a lock; only readers for a reader; fewer than N permits of the same semaphore
    /// for a permit). It is the join's revision for a lock granted at once, else the
    /// revision of the deletion (or of the read) that let the key through. Tools that check
    /// grants against etcd's history (`fencelock chaos --soak`) start from it.
    #[must_use]
    pub fn admitted_revision(&self) -> i64 {
        self.admitted
    }

    /// The lease the key is attached to.
    #[must_use]
    pub fn lease_id(&self) -> i64 {
        self.key.session.lease_id()
    }

    /// The session that keeps this lock's lease alive.
    #[must_use]
    pub fn session(&self) -> &Session {
        &self.key.session
    }

    fn key_lost(&self) -> bool {
        self.tracked.as_ref().is_some_and(TrackedKey::is_lost)
    }

    /// Runs `ops` in one etcd transaction that applies only while this guard still owns the
    /// lock (its key still has this guard's create revision). Returns
    /// [`LockError::NotHeld`] and applies nothing otherwise.
    #[tracing::instrument(skip(self, ops), fields(backend = "etcd", lock = %self.key.name(), token = %self.token))]
    pub async fn txn_if_held(&self, ops: Vec<TxnOp>) -> Result<TxnResponse, LockError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                &*self.key.key,
                CompareOp::Equal,
                self.token.as_revision(),
            )])
            .and_then(ops);
        let inner = self.key.inner();
        let timeout = inner.config.request_timeout;
        // Sent again only after a refusal that proves it was not applied (an old auth
        // token): then from a copy, kept for that alone.
        let (mut first, again) = (Some(txn.clone()), txn);
        let response = call_renewing(
            "guarded txn",
            Some(self.key.name()),
            timeout,
            &inner.renewal,
            || {
                let mut kv = inner.kv.clone();
                let txn = first.take().unwrap_or_else(|| again.clone());
                async move { kv.txn(txn).await }
            },
        )
        .await?;
        if response.succeeded() {
            Ok(response)
        } else {
            Err(LockError::NotHeld {
                name: self.key.name().to_owned(),
                token: self.token,
            })
        }
    }

    /// Puts `key = value` only while this guard owns the lock; see
    /// [`txn_if_held`](Self::txn_if_held).
    pub async fn put_if_held(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), LockError> {
        let put = TxnOp::put(key, value, None::<PutOptions>);
        self.txn_if_held(vec![put]).await.map(drop)
    }

    /// Begins a release: returns what the guard knew before it let go (lost, or its
    /// session gone: a key found gone after this was not taken away before the release).
    /// Its own delete is no loss to hear of; and until the delete's answer is in, the
    /// guard stays armed: dropped, it finishes the release in the background (its name
    /// spent, the delete sent may still land).
    pub(super) fn begin_release(&mut self) -> bool {
        let lost_before = self.key_lost() || !self.key.session.is_alive();
        self.tracked = None;
        self.releasing = true;
        lost_before
    }

    /// The key, for a release's delete.
    pub(super) fn queue_key(&self) -> &QueueKey {
        &self.key
    }

    /// Ends a release begun with [`begin_release`](Self::begin_release) whose delete was
    /// answered: the key's bookkeeping ([`QueueKey::deleted`]), the outcome decided and
    /// counted. The caller closes the session if the guard owned it
    /// ([`Detached::close_own_session`]).
    pub(super) fn released(
        mut self,
        lost_before: bool,
        deleted: Deleted,
    ) -> (ReleaseOutcome, Detached) {
        let detached = self.detach();
        detached.key.deleted(deleted);
        // Known lost before the release: not held, whatever the delete found (a key under
        // its name now is not the one it held). Otherwise, nothing found to delete after
        // an attempt without an answer: that attempt deleted it, or someone else did
        // before it landed (nothing tells which).
        let (outcome, counted) = if lost_before {
            (ReleaseOutcome::NotHeld, Release::NotHeld)
        } else if deleted.removed {
            (ReleaseOutcome::Released, Release::Released)
        } else if deleted.ambiguous {
            (ReleaseOutcome::Unconfirmed, Release::Released)
        } else {
            (ReleaseOutcome::NotHeld, Release::NotHeld)
        };
        metrics::release(Backend::Etcd, counted);
        (outcome, detached)
    }

    /// Ends a release begun with [`begin_release`](Self::begin_release) whose delete
    /// failed (`err`, after its retries): counted, and the key removed in the background,
    /// retried until confirmed or the session is gone.
    pub(super) fn release_failed(mut self, err: &LockError) {
        metrics::release(Backend::Etcd, Release::Failed);
        metrics::error(Backend::Etcd, "release", err);
        tokio::spawn(self.detach().finish());
    }

    /// The parts a background release needs, leaving this guard marked released.
    fn detach(&mut self) -> Detached {
        self.released = true;
        self.holding = None;
        // The guard's own delete is no loss to report.
        self.tracked = None;
        Detached {
            key: self.key.detach(),
            owns_session: self.owns_session,
        }
    }
}

/// A release that outlives its guard.
pub(super) struct Detached {
    key: QueueKey,
    owns_session: bool,
}

impl Detached {
    /// Retries the delete until it gets through or the lease is gone: on a shared,
    /// renewed session a key left behind would block the lock for as long as the client
    /// lives.
    async fn finish(self) {
        self.key.remove().await;
        self.close_own_session().await;
    }

    /// Closes the session if the guard owned it: its lease served this lock alone.
    pub(super) async fn close_own_session(&self) {
        if self.owns_session {
            // This lease served this lock alone; its key is gone or was never ours.
            // Boxed: a revoke's future (about 11 KiB) would otherwise sit in every
            // release's future, copied on every release of a renewed lock too.
            let _ = Box::pin(self.key.session.close()).await;
        }
    }
}

impl LockGuard for EtcdGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        self.key.name()
    }

    async fn lost(&self) -> LossReason {
        match &self.tracked {
            Some(tracked) => tokio::select! {
                // The lease's loss first: a revoked lease deletes the key too.
                biased;
                reason = self.key.session.lost() => reason,
                reason = tracked.lost() => reason,
            },
            None => self.key.session.lost().await,
        }
    }

    fn is_held(&self) -> bool {
        !self.released && self.key.session.is_alive() && !self.key_lost()
    }

    fn lease_remaining(&self) -> Option<std::time::Duration> {
        Some(if self.released || self.key_lost() {
            std::time::Duration::ZERO
        } else {
            self.key.inner().remaining()
        })
    }

    #[tracing::instrument(skip(self), fields(backend = "etcd", lock = %self.key.name(), token = %self.token))]
    async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        let lost_before = self.begin_release();
        match self.key.delete().await {
            Ok(deleted) => {
                let (outcome, detached) = self.released(lost_before, deleted);
                detached.close_own_session().await;
                Ok(outcome)
            }
            Err(err) => {
                self.release_failed(&err);
                Err(err)
            }
        }
    }

    /// Deletes every guard's key in one transaction (one Raft proposal per session: one
    /// for a whole `lock_all`), each guard's outcome decided as
    /// [`release`](Self::release) decides it; the worst stands for all. Guards of several
    /// sessions are released in one transaction per session, all at once.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): dropped before the answer, every guard's release
    /// is finished in the background (its key's name never reused, the dropped
    /// transaction may still land).
    #[tracing::instrument(skip(guards), fields(backend = "etcd", locks = guards.len()))]
    async fn release_all(guards: Vec<Self>) -> Result<ReleaseOutcome, LockError> {
        super::release_all::release_all(guards).await
    }
}

impl Drop for EtcdGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Outside a runtime there is nothing to run the release on: the lease (revoked
        // when the session goes, or expired) frees the lock.
        metrics::release(Backend::Etcd, Release::Dropped);
        if self.releasing {
            self.key.spend();
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.detach().finish());
        }
    }
}
