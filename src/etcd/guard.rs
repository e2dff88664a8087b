//! The etcd lock guard: token, loss, guarded release, owner-guarded transactions.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};

use super::acquire::delete_key;
use super::call::call;
use super::session::Session;
use crate::metrics::{self, Holding, Release};
use crate::{Backend, FencingToken, LockError, LockGuard, LossReason, ReleaseOutcome};

/// A held etcd lock.
///
/// Its [`token`](LockGuard::token) is the create revision of its key: strictly larger than
/// the token of every earlier holder of the same lock, across leader failovers too.
/// Dropping the guard releases the lock in the background (best effort; the lease expires
/// it otherwise).
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct EtcdGuard {
    session: Session,
    owns_session: bool,
    name: String,
    key: String,
    /// The key's slot among this session's keys for the lock (see `slots.rs`).
    slot: u64,
    token: FencingToken,
    released: bool,
    /// Ends when the guard is released or dropped, before its session may close (a
    /// closing own session must not count this lock as lost).
    holding: Option<Holding>,
}

impl EtcdGuard {
    pub(crate) fn new(
        session: Session,
        owns_session: bool,
        name: String,
        key: String,
        slot: u64,
        token: FencingToken,
    ) -> Self {
        let holding = Some(session.inner.holding());
        Self {
            session,
            owns_session,
            name,
            key,
            slot,
            token,
            released: false,
            holding,
        }
    }

    /// The full etcd key of this grant.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease the key is attached to.
    #[must_use]
    pub fn lease_id(&self) -> i64 {
        self.session.lease_id()
    }

    /// The session that keeps this lock's lease alive.
    #[must_use]
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Runs `ops` in one etcd transaction that applies only while this guard still owns the
    /// lock (its key still has this guard's create revision). Returns
    /// [`LockError::NotHeld`] and applies nothing otherwise.
    #[tracing::instrument(skip(self, ops), fields(backend = "etcd", lock = %self.name, token = %self.token))]
    pub async fn txn_if_held(&self, ops: Vec<TxnOp>) -> Result<TxnResponse, LockError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.token.as_revision(),
            )])
            .and_then(ops);
        let inner = &self.session.inner;
        let mut client = inner.kv.clone();
        let timeout = inner.config.request_timeout;
        let response = call("guarded txn", Some(&self.name), timeout, client.txn(txn)).await?;
        if response.succeeded() {
            Ok(response)
        } else {
            Err(LockError::NotHeld {
                name: self.name.clone(),
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

    /// The parts a background release needs, leaving this guard marked released.
    fn detach(&mut self) -> Detached {
        self.released = true;
        self.holding = None;
        Detached {
            session: self.session.clone(),
            owns_session: self.owns_session,
            name: std::mem::take(&mut self.name),
            key: std::mem::take(&mut self.key),
            slot: self.slot,
        }
    }
}

/// A release that outlives its guard.
struct Detached {
    session: Session,
    owns_session: bool,
    name: String,
    key: String,
    slot: u64,
}

impl Detached {
    /// Retries the delete until it gets through or the lease is gone: on a shared, renewed
    /// session a key left behind would block the lock for as long as the client lives.
    async fn finish(self) {
        let mut delay = std::time::Duration::from_millis(50);
        while self.session.is_alive() {
            match delete_key(&self.session.inner, &self.name, &self.key).await {
                Ok(_) => {
                    self.give_back_slot();
                    break;
                }
                Err(err) => {
                    tracing::warn!(%err, lock = %self.name, "release failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(1));
                }
            }
        }
        self.close_own_session().await;
    }

    /// The key is confirmed gone: its name may serve the next acquisition.
    fn give_back_slot(&self) {
        let prefix = super::keys::lock_prefix(&self.session.inner.config.namespace, &self.name);
        self.session.inner.slots.give_back(&prefix, self.slot);
    }

    async fn close_own_session(&self) {
        if self.owns_session {
            // This lease served this lock alone; its key is gone or was never ours.
            let _ = self.session.close().await;
        }
    }
}

impl LockGuard for EtcdGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn lost(&self) -> LossReason {
        self.session.lost().await
    }

    fn is_held(&self) -> bool {
        !self.released && self.session.is_alive()
    }

    fn lease_remaining(&self) -> Option<std::time::Duration> {
        Some(if self.released {
            std::time::Duration::ZERO
        } else {
            self.session.inner.remaining()
        })
    }

    #[tracing::instrument(skip(self), fields(backend = "etcd", lock = %self.name, token = %self.token))]
    async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        // Until the answer is in, the guard stays armed: if this future is dropped, the
        // guard's drop finishes the release in the background.
        let outcome = delete_key(&self.session.inner, &self.name, &self.key).await;
        let detached = self.detach();
        match outcome {
            Ok(deleted) => {
                detached.give_back_slot();
                detached.close_own_session().await;
                let (outcome, counted) = if deleted {
                    (ReleaseOutcome::Released, Release::Released)
                } else {
                    (ReleaseOutcome::NotHeld, Release::NotHeld)
                };
                metrics::release(Backend::Etcd, counted);
                Ok(outcome)
            }
            Err(err) => {
                metrics::release(Backend::Etcd, Release::Failed);
                metrics::error(Backend::Etcd, "release", &err);
                tokio::spawn(detached.finish());
                Err(err)
            }
        }
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
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.detach().finish());
        }
    }
}
