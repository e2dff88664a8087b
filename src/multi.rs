//! Several locks at once on any backend: [`lock_all`] takes them one by one in name
//! order, and holds them in a [`MultiGuard`].
//!
//! # Why no two such acquisitions deadlock
//!
//! A deadlock needs a cycle of holders, each waiting for a lock the next one holds. Every
//! [`lock_all`] takes its locks in one global order (their names, sorted), and waits only
//! for the next lock in that order while holding earlier ones: a holder of `b` waiting
//! for `c` holds nothing after `c`, so whoever holds `c` never waits for `b` in a
//! `lock_all`. A single-name lock holds one lock and waits for nothing while holding it.
//! So no cycle can form, whatever the sets and the order the caller gives them in.
//!
//! This is the ordering rule of every textbook; it costs what one lock after another
//! costs (one wait per name, earlier locks held meanwhile), and each lock keeps its own
//! token. ZooKeeper has better: `ZooKeeperLocker::lock_all`
//! queues in every lock in one transaction, with one token for all. Mixing the two on one
//! ZooKeeper name stays deadlock-free only if every multi-lock user of those names takes
//! the same kind: keep to one.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::{FencingToken, LockBackend, LockError, LockGuard, LockOptions, LossReason};
use crate::{ReleaseOutcome, name::distinct_names};

/// The most locks one [`lock_all`] takes.
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

    /// Releases every lock, all at once; `Released` only if every one was still held.
    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        release_all(self.guards).await
    }
}

/// Releases `guards` at once: the worst outcome (an error, then `NotHeld`, then
/// `Unconfirmed`) stands for all (shared with ZooKeeper's one-transaction guard).
pub(crate) async fn release_all<G: LockGuard>(guards: Vec<G>) -> Result<ReleaseOutcome, LockError> {
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
    }
    let mut outcome = Ok(ReleaseOutcome::Released);
    while let Some(released) = releases.join_next().await {
        match released {
            Ok(Ok(ReleaseOutcome::Released)) => {}
            Ok(Ok(ReleaseOutcome::NotHeld)) => {
                if outcome.is_ok() {
                    outcome = Ok(ReleaseOutcome::NotHeld);
                }
            }
            Ok(Ok(ReleaseOutcome::Unconfirmed)) => {
                if matches!(outcome, Ok(ReleaseOutcome::Released)) {
                    outcome = Ok(ReleaseOutcome::Unconfirmed);
                }
            }
            Ok(Err(err)) => outcome = Err(err),
            // A release task that panicked: its guard's drop released in the background.
            Err(_) => {}
        }
    }
    outcome
}

/// Takes every lock of `names` on `backend`, one by one in name order (see the module
/// docs for why that cannot deadlock), each name once. A wait timeout in `options`
/// bounds the whole call.
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
/// the background) and leaves the one it was waiting for as that backend's cancelled
/// `lock` does.
pub async fn lock_all<B: LockBackend>(
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

/// Takes every lock of `names` if each is free when its turn comes; `Ok(None)` (every
/// lock taken so far released) otherwise.
///
/// # Cancel safety
///
/// Cancel safe, as [`lock_all`].
pub async fn try_lock_all<B: LockBackend>(
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
