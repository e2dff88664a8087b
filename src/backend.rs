//! The backend-neutral lock trait and its guard.

use std::future::Future;

use crate::{FencingToken, LockError, LockOptions, LossReason, MultiGuard};

/// A lock service: etcd, Redis, Redlock or PostgreSQL advisory locks.
///
/// An application or a benchmark switches backend by changing the constructor only.
///
/// ```no_run
/// use fencelock::{LockBackend, LockGuard, LockOptions};
///
/// async fn charge_once<B: LockBackend>(locks: &B) -> Result<(), fencelock::LockError> {
///     let guard = locks.lock("payment:8891", &LockOptions::new()).await?;
///     // Pass the token to storage with every write it protects.
///     println!("charging with fencing token {}", guard.token());
///     guard.release().await?;
///     Ok(())
/// }
/// ```
pub trait LockBackend: Send + Sync {
    /// The guard this backend hands out.
    type Guard: LockGuard;

    /// Takes the lock, waiting (in FIFO order where the backend supports it) until it is
    /// free or the wait timeout of `options` runs out.
    ///
    /// The wait timeout bounds the whole call (connecting a session, joining the queue,
    /// waiting), plus a moment (at most 250 ms on etcd) to leave the queue cleanly.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future (or timing it out) leaves no queue entry or lock key
    /// behind: it is removed in the background, retried until the server confirms it or
    /// the session that carries it is gone. A grant that races with the drop is released
    /// in the background.
    fn lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send;

    /// Takes the lock if it is free right now; `Ok(None)` if someone else holds it or
    /// waits for it ahead of us.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockError>> + Send;

    /// Takes every lock of `names` together (each name once, in any order given), waiting
    /// until all are held; the wait timeout of `options` bounds the whole call.
    ///
    /// By default one by one in name order, each lock with its own token, which no two
    /// such acquisitions can deadlock over (see [`lock_all`](crate::lock_all)). A backend that can queue in
    /// several locks in one transaction overrides it (etcd, ZooKeeper), and then every
    /// multi-lock acquisition on it must be that one: the two kinds mixed on the same
    /// names can deadlock. So a wrapper that implements this trait around such a backend
    /// must forward `lock_all` and [`try_lock_all`](Self::try_lock_all), not leave them to
    /// these defaults. Redis and Redlock override it too (all or none in one script,
    /// waiting while holding nothing), which mixes safely with the default; a wrapper
    /// should still forward it there, or its sets are taken one by one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock): a dropped call releases the locks it took
    /// (in the background) and leaves the queues it waits in.
    fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> impl Future<Output = Result<MultiGuard<Self::Guard>, LockError>> + Send
    where
        Self: Sized,
    {
        crate::multi::lock_in_order(self, names, options)
    }

    /// Takes every lock of `names` together if all are free right now; `Ok(None)`
    /// (nothing left taken) otherwise. By default one by one in name order, as
    /// [`lock_all`](Self::lock_all).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock_all`](Self::lock_all).
    fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<MultiGuard<Self::Guard>>, LockError>> + Send
    where
        Self: Sized,
    {
        crate::multi::try_lock_in_order(self, names, options)
    }
}

/// Proof of holding a lock, as far as the backend can tell.
///
/// A guard cannot promise exclusion: its holder may pause past the lease. It carries the
/// [`FencingToken`] that lets storage refuse the writes of a holder that lost the lock.
/// Dropping a guard releases the lock in the background (best effort); call
/// [`release`](Self::release) to know the outcome.
pub trait LockGuard: Send + Sync + 'static {
    /// This grant's fencing token: larger than every earlier grant's of the same lock.
    fn token(&self) -> FencingToken;

    /// The lock's name.
    fn name(&self) -> &str;

    /// Resolves when ownership may be gone (lease expired, revoked, connection lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes state; call it again to keep watching.
    fn lost(&self) -> impl Future<Output = LossReason> + Send + '_;

    /// Cheap local check: `false` once the loss is known or the lease's time has run out by
    /// this process's clock. `true` is not a promise: use the token for correctness.
    fn is_held(&self) -> bool;

    /// How long the lock is certainly still ours by this machine's clock, counting time the
    /// machine spent suspended: the time left until the lease's local deadline (when the
    /// last confirmed renewal was *sent*, plus the TTL, so the server's lease cannot end
    /// earlier). Zero once the loss is known or the deadline has passed; it grows again
    /// with each confirmed renewal. `None` for locks without a lease (PostgreSQL advisory
    /// locks last exactly as long as their connection).
    ///
    /// This is what a process that must stop its work *before* anyone else may take the
    /// lock schedules by (`fencelock run` sends SIGKILL to its command no later than this).
    fn lease_remaining(&self) -> Option<std::time::Duration>;

    /// Runs `work` while the lock is held, and **drops it before the lease can pass on**:
    /// at the guard's loss (`lost()`), or a margin before the lease's local deadline
    /// (20 ms and a hundredth of the time left at the start, on the boot-time clock, as
    /// [`lease_remaining`](Self::lease_remaining) counts it; renewals move the deadline
    /// and the section goes on). Returns `work`'s output, or
    /// [`LockError::LeaseLost`] if it was cut short. The in-process twin of
    /// `fencelock run`.
    ///
    /// Dropping a future stops it at its next `.await`: a write it had sent is not
    /// called back, and may still reach storage after the next holder's. That is why the
    /// token still goes to storage with every write; this narrows the window in which a
    /// stale section keeps working, the fence closes it. A section that blocks its thread
    /// without awaiting is not stopped at all (nor is a paused process): the same.
    ///
    /// ```no_run
    /// use fencelock::{LockBackend, LockGuard, LockOptions};
    ///
    /// # async fn run<B: LockBackend>(locks: &B) -> Result<(), fencelock::LockError> {
    /// let guard = locks.lock("nightly-report", &LockOptions::new()).await?;
    /// let token = guard.token();
    /// let rows = guard
    ///     .run(async {
    ///         // ... the critical section, each write carrying `token` ...
    ///         42
    ///     })
    ///     .await?; // Err(LeaseLost) if the lock was lost first
    /// guard.release().await?;
    /// # let _ = (rows, token); Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the returned future drops `work`, and the lock stays held
    /// (release it, or drop the guard).
    fn run<F>(&self, work: F) -> impl Future<Output = Result<F::Output, LockError>> + Send
    where
        F: Future + Send,
        F::Output: Send,
        Self: Sized,
    {
        crate::scoped::run(self, work)
    }

    /// Releases the lock, reporting whether we still owned it. Never removes another
    /// holder's lock.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the release is finished in the background.
    fn release(self) -> impl Future<Output = Result<ReleaseOutcome, LockError>> + Send;

    /// Releases `guards` together, each as [`release`](Self::release) would, reporting the
    /// worst outcome: an error, then [`ReleaseOutcome::NotHeld`], then
    /// [`ReleaseOutcome::Unconfirmed`], then [`ReleaseOutcome::Released`] (so `Released`
    /// only if every lock was still held). [`MultiGuard`]'s
    /// [`release`](Self::release) calls it.
    ///
    /// By default every guard is released on its own, all at once. A backend that can
    /// release several locks in one request overrides it: etcd deletes every key of one
    /// session in one transaction (one Raft proposal for a whole `lock_all`). A wrapper
    /// around such a guard should forward it.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): if the future is dropped, every release is finished
    /// in the background.
    fn release_all(
        guards: Vec<Self>,
    ) -> impl Future<Output = Result<ReleaseOutcome, LockError>> + Send
    where
        Self: Sized,
    {
        crate::multi::release_all(guards)
    }
}

/// What [`LockGuard::release`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// We still owned the lock, and now it is free.
    Released,
    /// The lock was no longer ours (lease expired or revoked, or its key deleted): the
    /// guard knew it lost before the release, or the release found nothing to delete. (A
    /// guard that knew its lease ran out by the local clock still tries to delete its key,
    /// which the server's lease may not have taken yet; that delete may remove it.)
    NotHeld,
    /// Our key is gone, but who removed it is not known: an attempt of the release got no
    /// answer and the retry found nothing to delete, so either that attempt deleted the
    /// key, or someone else did before it (an operator, `fencelock break`, the lease's
    /// end on the server), and another client may have held the lock since (or hold it
    /// now). Nothing told this guard it was lost before the release began. etcd only.
    Unconfirmed,
}
