//! Several locks at once on any backend: [`lock_all`] takes them through the backend's
//! [`LockBackend::lock_all`], and holds them in a [`MultiGuard`]. etcd and ZooKeeper queue
//! in every lock with one transaction; Redis and Redlock take them all or none in one
//! script (`RedisLocker`'s and `RedlockLocker`'s `lock_all`); backends without a way of
//! their own (PostgreSQL, MariaDB) take them one by one in name order.
//!
//! # Why no two such acquisitions deadlock
//!
//! One by one in name order: a deadlock needs a cycle of holders, each waiting for a lock
//! the next one holds. Every such acquisition takes its locks in one global order (their
//! names, sorted), and waits only for the next lock in that order while holding earlier
//! ones: a holder of `b` waiting for `c` holds nothing after `c`, so whoever holds `c`
//! never waits for `b`. A single-name lock holds one lock and waits for nothing while
//! holding it. So no cycle can form, whatever the sets and the order the caller gives
//! them in. This is the ordering rule of every textbook; it costs what one lock after
//! another costs (one wait per name, earlier locks held meanwhile), and each lock keeps
//! its own token.
//!
//! All or none (Redis, Redlock): an attempt either finds every lock free and takes them
//! all in one atomic step, or takes none; the taker waits holding **nothing**, so it is in
//! no cycle at all, and it mixes safely with single locks and with takers one by one on
//! the same names. Each lock keeps its own token. It is not fair: a set is granted only
//! when all its locks are free at once, so under steady contention on its names a large
//! set may wait long (see `docs/redis.md`, "Several locks at once").
//!
//! In one transaction (etcd: `EtcdLocker::lock_all`; ZooKeeper:
//! `ZooKeeperLocker::lock_all`): every key of one acquisition shares one revision (zxid),
//! each queue is ordered by it, and a waiter waits only for lower ones in each queue, so
//! waiting follows the commit order, which has no cycle; the locks share one token.
//!
//! The one-transaction kind and the one-by-one kind must **not** be mixed on the same
//! names: a queued waiter holds its place in each queue while it waits, so an ordered
//! taker holding `a` (revision `r_a`) and queued for `b` (revision `r_b`, later) and a
//! one-transaction waiter at `r_a < r < r_b` wait for each other. That is why on etcd and
//! ZooKeeper every [`lock_all`] is the one-transaction kind: the ordered one is only the
//! trait's default.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::{FencingToken, LockBackend, LockError, LockGuard, LockOptions, LossReason};
use crate::{ReleaseOutcome, name::distinct_names};

/// The most locks one [`lock_all`] takes one by one (etcd's, ZooKeeper's and Redis's own
/// have limits of their own: `etcd::MAX_LOCK_ALL`, `zookeeper::MAX_LOCK_ALL`,
/// `redis::MAX_LOCK_ALL`).
pub const MAX_LOCKS: usize = 256;

/// Several locks held together: one guard per lock, in name order.
///
/// As a [`LockGuard`] its [`token`](LockGuard::token) is the smallest of its locks'
/// tokens (each lock's own is in [`tokens`](Self::tokens): fence each resource with the
/// token of the lock that guards it), its [`name`](LockGuard::name) the names joined by
/// commas, and it is lost as soon as any one of its locks is
/// ([`lost_which`](Self::lost_which) says which).
#[must_use = "dropping the guard releases the locks in the background"]
#[derive(Debug)]
pub struct MultiGuard<G> {
    guards: Vec<G>,
    names: String,
}

impl<G: LockGuard> MultiGuard<G> {
    /// The guards of locks taken together (in name order), named `names` (joined by
    /// commas). (The backends that take them in one transaction or script build it.)
    #[cfg(any(feature = "etcd", feature = "zookeeper", feature = "redis"))]
    pub(crate) fn new(guards: Vec<G>, names: String) -> Self {
        Self { guards, names }
    }

    /// Each lock's name and token, in name order.
    #[must_use]
    pub fn tokens(&self) -> Vec<(&str, FencingToken)> {
        self.guards.iter().map(|g| (g.name(), g.token())).collect()
    }

    /// The guard of each lock, in name order.
    pub fn guards(&self) -> &[G] {
        &self.guards
    }

    /// Resolves when any of the locks may be gone: its name, and why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost_which(&self) -> (String, LossReason) {
        first_lost(&self.guards).await
    }
}

/// Resolves when any of `guards` may be lost: its name, and why (shared with
/// ZooKeeper's one-transaction guard).
pub(crate) async fn first_lost<G: LockGuard>(guards: &[G]) -> (String, LossReason) {
    let mut watching: Vec<_> = guards
        .iter()
        .map(|guard| Box::pin(async move { (guard.name().to_owned(), guard.lost().await) }))
        .collect();
    std::future::poll_fn(|cx| {
        for loss in &mut watching {
            if let Poll::Ready(found) = loss.as_mut().poll(cx) {
                return Poll::Ready(found);
            }
        }
        Poll::Pending
    })
    .await
}

impl<G: LockGuard> LockGuard for MultiGuard<G> {
    fn token(&self) -> FencingToken {
        self.guards
            .iter()
            .map(LockGuard::token)
            .min()
            .unwrap_or(FencingToken::new(0))
    }

    fn name(&self) -> &str {
        &self.names
    }

    async fn lost(&self) -> LossReason {
        self.lost_which().await.1
    }

    fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    fn lease_remaining(&self) -> Option<Duration> {
        self.guards
            .iter()
            .filter_map(LockGuard::lease_remaining)
            .min()
    }

    /// Releases every lock together, through [`LockGuard::release_all`] (on etcd one
    /// transaction deletes every key); `Released` only if every one was still held.
    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        G::release_all(self.guards).await
    }
}

/// Releases `guards` at once, each on its own: the worst outcome (an error, then
/// `NotHeld`, then `Unconfirmed`) stands for all ([`LockGuard::release_all`]'s default,
/// shared with ZooKeeper's one-transaction guard).
pub(crate) async fn release_all<G: LockGuard>(guards: Vec<G>) -> Result<ReleaseOutcome, LockError> {
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
    }
    let mut outcome = Ok(ReleaseOutcome::Released);
    while let Some(released) = releases.join_next().await {
        // A release task that panicked: its guard's drop released in the background.
        if let Ok(released) = released {
            outcome = worse(outcome, released);
        }
    }
    outcome
}

/// The worse of two release outcomes, the one that stands for a set of locks: an error
/// (the later one), then `NotHeld`, then `Unconfirmed`, then `Released`.
pub(crate) fn worse(
    so_far: Result<ReleaseOutcome, LockError>,
    next: Result<ReleaseOutcome, LockError>,
) -> Result<ReleaseOutcome, LockError> {
    let rank = |outcome: &ReleaseOutcome| match outcome {
        ReleaseOutcome::Released => 0,
        ReleaseOutcome::Unconfirmed => 1,
        ReleaseOutcome::NotHeld => 2,
    };
    match (so_far, next) {
        (_, Err(err)) => Err(err),
        (Err(err), Ok(_)) => Err(err),
        (Ok(so_far), Ok(next)) => Ok(if rank(&next) > rank(&so_far) {
            next
        } else {
            so_far
        }),
    }
}

/// Takes every lock of `names` on `backend` together, each name once, through
/// [`LockBackend::lock_all`]: one transaction on etcd and ZooKeeper, all or none in one
/// script on Redis and Redlock, one by one in name order elsewhere (see the module docs
/// for why none of them can deadlock). A wait timeout in `options` bounds the whole
/// call.
///
/// ```no_run
/// use fencelock::{LockGuard, LockOptions, etcd::EtcdLocker};
///
/// # async fn run(locks: &EtcdLocker) -> Result<(), fencelock::LockError> {
/// let both = fencelock::lock_all(locks, &["warehouse-b", "warehouse-a"], &LockOptions::new()).await?;
/// for (name, token) in both.tokens() {
///     println!("{name}: fence with {token}");
/// }
/// both.release().await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Cancel safe, as each backend's `lock`: a dropped call releases the locks it took (in
/// the background) and leaves the queues it was waiting in as that backend's cancelled
/// `lock` does.
pub async fn lock_all<B: LockBackend>(
    backend: &B,
    names: &[&str],
    options: &LockOptions,
) -> Result<MultiGuard<B::Guard>, LockError> {
    backend.lock_all(names, options).await
}

/// Takes every lock of `names` together if each is free, through
/// [`LockBackend::try_lock_all`]; `Ok(None)` (nothing left taken) otherwise.
///
/// # Cancel safety
///
/// Cancel safe, as [`lock_all`].
pub async fn try_lock_all<B: LockBackend>(
    backend: &B,
    names: &[&str],
    options: &LockOptions,
) -> Result<Option<MultiGuard<B::Guard>>, LockError> {
    backend.try_lock_all(names, options).await
}

/// [`LockBackend::lock_all`]'s default: every lock of `names` one by one in name order.
pub(crate) async fn lock_in_order<B: LockBackend>(
    backend: &B,
    names: &[&str],
    options: &LockOptions,
) -> Result<MultiGuard<B::Guard>, LockError> {
    let names = distinct_names(names, MAX_LOCKS)?;
    let deadline = options.wait_timeout().map(|wait| Instant::now() + wait);
    let mut guards = Vec::with_capacity(names.len());
    for name in &names {
        let mut attempt = options.clone();
        if let Some(deadline) = deadline {
            attempt = attempt.with_wait_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        match backend.lock(name, &attempt).await {
            Ok(guard) => guards.push(guard),
            Err(err) => {
                let _ = release_all(guards).await;
                return Err(err);
            }
        }
    }
    Ok(MultiGuard {
        guards,
        names: names.join(","),
    })
}

/// [`LockBackend::try_lock_all`]'s default: every lock of `names` if each is free when
/// its turn comes, in name order; `Ok(None)` (every lock taken so far released)
/// otherwise.
pub(crate) async fn try_lock_in_order<B: LockBackend>(
    backend: &B,
    names: &[&str],
    options: &LockOptions,
) -> Result<Option<MultiGuard<B::Guard>>, LockError> {
    let names = distinct_names(names, MAX_LOCKS)?;
    let mut guards = Vec::with_capacity(names.len());
    for name in &names {
        match backend.try_lock(name, options).await {
            Ok(Some(guard)) => guards.push(guard),
            Ok(None) => {
                let _ = release_all(guards).await;
                return Ok(None);
            }
            Err(err) => {
                let _ = release_all(guards).await;
                return Err(err);
            }
        }
    }
    Ok(Some(MultiGuard {
        guards,
        names: names.join(","),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_release_outcome_stands_for_the_set() {
        use ReleaseOutcome::{NotHeld, Released, Unconfirmed};
        let worst = |outcomes: Vec<Result<ReleaseOutcome, LockError>>| {
            outcomes.into_iter().fold(Ok(Released), worse)
        };
        assert_eq!(worst(vec![]).ok(), Some(Released));
        assert_eq!(worst(vec![Ok(Released), Ok(Released)]).ok(), Some(Released));
        for order in [
            vec![Ok(Unconfirmed), Ok(Released)],
            vec![Ok(Released), Ok(Unconfirmed)],
        ] {
            assert_eq!(worst(order).ok(), Some(Unconfirmed));
        }
        for order in [
            vec![Ok(NotHeld), Ok(Unconfirmed), Ok(Released)],
            vec![Ok(Released), Ok(Unconfirmed), Ok(NotHeld)],
            vec![Ok(Unconfirmed), Ok(NotHeld), Ok(Unconfirmed)],
        ] {
            assert_eq!(worst(order).ok(), Some(NotHeld));
        }
        let failed = || {
            Err(LockError::InvalidOption {
                option: "test",
                reason: "failed".into(),
            })
        };
        for order in [
            vec![failed(), Ok(NotHeld)],
            vec![Ok(NotHeld), failed(), Ok(Released)],
        ] {
            assert!(worst(order).is_err());
        }
    }
}
