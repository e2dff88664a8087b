//! The guard of a Redis or Redlock lock.

use std::sync::Arc;

use super::core::Core;
use super::keys::LockKeys;
use super::renewer::Registration;
use crate::metrics::{self, Holding, Release};
use crate::{FencingToken, LockError, LockGuard, LossReason, ReleaseOutcome};

/// A held Redis (or Redlock) lock.
///
/// Its token comes from a per-lock `INCR` counter. Unlike etcd's revision it is not
/// replicated synchronously: after a failover the counter can repeat (two holders with
/// the same token) and storage with a strict `<` check then wrongly *rejects*, never
/// wrongly accepts. For Redlock it is the largest counter among the agreeing masters.
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedisGuard {
    core: Arc<Core>,
    name: Arc<str>,
    keys: LockKeys,
    owner: Arc<str>,
    /// The id this holder waited under in the lock's waiters' set, if it registered
    /// there: the release unregisters it (`scripts.rs`, `RELEASE`).
    waiter: Option<Arc<str>>,
    token: FencingToken,
    registration: Registration,
    released: bool,
    /// Ends when the guard is released or dropped (metrics, loss counting).
    holding: Option<Holding>,
}

impl std::fmt::Debug for RedisGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGuard")
            .field("backend", &self.core.backend)
            .field("name", &self.name)
            .field("token", &self.token)
            .field("lost", &self.registration.loss.current())
            .finish_non_exhaustive()
    }
}

impl RedisGuard {
    pub(crate) fn new(
        core: Arc<Core>,
        name: Arc<str>,
        keys: LockKeys,
        owner: Arc<str>,
        waiter: Option<Arc<str>>,
        token: FencingToken,
        registration: Registration,
    ) -> Self {
        let holding = Some(registration.loss.holding());
        Self {
            core,
            name,
            keys,
            owner,
            waiter,
            token,
            registration,
            released: false,
            holding,
        }
    }

    /// The Redis key of the lock.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.keys.lock
    }

    /// The random owner value stored in the lock key (128 bits, hex).
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Ends the hold here: no longer renewed, counted or released on drop.
    fn disarm(&mut self) {
        self.released = true;
        self.holding = None;
        self.core.renewer.unregister(self.registration.id);
    }

    /// Disarms the guard, and hands its release to a task that outlives it.
    fn detach(&mut self) -> Detached {
        self.disarm();
        Detached {
            core: self.core.clone(),
            name: std::mem::take(&mut self.name),
            keys: self.keys.clone(),
            owner: std::mem::take(&mut self.owner),
            waiter: self.waiter.take(),
        }
    }
}

/// A release that outlives its guard.
struct Detached {
    core: Arc<Core>,
    name: Arc<str>,
    keys: LockKeys,
    owner: Arc<str>,
    waiter: Option<Arc<str>>,
}

impl Detached {
    async fn run(self) {
        // Unlike etcd's renewed session, a key left behind here expires by its TTL: one
        // attempt is enough.
        let waiter = self.waiter.as_deref();
        if let Err(err) = self
            .core
            .release(&self.keys, &self.owner, &self.name, waiter)
            .await
        {
            tracing::warn!(%err, lock = %self.name, "background release failed; the TTL will free the lock");
        }
    }
}

impl LockGuard for RedisGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn lost(&self) -> LossReason {
        // The deadline too, not only the renewer's report: whatever becomes of the
        // renewal task (one never polled, its runtime idle), a lock whose time ran out
        // by our clock is reported, as `is_held()` reports it.
        let registration = &self.registration;
        tokio::select! {
            biased;
            reason = registration.loss.wait() => reason,
            () = registration.clock.passed_eventually() => LossReason::Expired,
        }
    }

    fn is_held(&self) -> bool {
        !self.released
            && self.registration.loss.current().is_none()
            && !self.registration.clock.has_passed()
    }

    fn lease_remaining(&self) -> Option<std::time::Duration> {
        let gone = self.released || self.registration.loss.current().is_some();
        Some(if gone {
            std::time::Duration::ZERO
        } else {
            self.registration.clock.remaining()
        })
    }

    #[tracing::instrument(skip(self), fields(backend = %self.core.backend, lock = %self.name, token = %self.token))]
    async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        // The guard stays armed until the answer is in: dropping this future releases in
        // the background instead.
        let deleted = self
            .core
            .release(&self.keys, &self.owner, &self.name, self.waiter.as_deref())
            .await;
        // (Not `detach`: its copies of the core and the keys were made only to be
        // dropped, and the core's count is shared by every task of the locker.)
        self.disarm();
        let backend = self.core.backend;
        match deleted {
            Ok(true) => {
                metrics::release(backend, Release::Released);
                Ok(ReleaseOutcome::Released)
            }
            Ok(false) => {
                metrics::release(backend, Release::NotHeld);
                Ok(ReleaseOutcome::NotHeld)
            }
            Err(err) => {
                metrics::release(backend, Release::Failed);
                metrics::error(backend, "release", &err);
                Err(err)
            }
        }
    }
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        metrics::release(self.core.backend, Release::Dropped);
        let detached = self.detach();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(detached.run());
        }
    }
}
