//! What fencelock reports about its locks, through the [`metrics`](https://docs.rs/metrics)
//! facade: install any recorder (a Prometheus exporter, StatsD, ...) and these appear;
//! with none installed, the reports made on every successful acquisition, release and hold
//! allocate nothing (their keys are built once per process) and go to the facade's
//! no-op recorder (errors, losses, renewals, and everything with [`label_lock_names`] on,
//! build their labels per report); the locks held and their losses are counted with
//! atomics.
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | `fencelock_acquire_seconds` | histogram | seconds | `backend`, `outcome` | how long each acquisition took, from the call to its result |
//! | `fencelock_grants_total` | counter | | `backend` | locks granted |
//! | `fencelock_locks_held` | gauge | | `backend` | guards alive now (held, or lost and not yet dropped) |
//! | `fencelock_hold_seconds` | histogram | seconds | `backend` | from the grant to the guard's release or drop |
//! | `fencelock_releases_total` | counter | | `backend`, `outcome` | releases: `released`, `not_held` (found lost), `error`, `dropped` (a guard dropped without `release()`: released in the background) |
//! | `fencelock_losses_total` | counter | | `backend`, `reason` | held locks lost, counted when the library learns of the loss (not when a guard notices): `expired`, `revoked`, `closed`, `disconnected`, `key_deleted` |
//! | `fencelock_renewals_total` | counter | | `backend`, `outcome` | lease renewals: `ok`, `failed` (an error or no answer; the lease may still live) |
//! | `fencelock_errors_total` | counter | | `backend`, `operation`, `kind` | errors returned to the caller, by [`LockError`] kind |
//! | `fencelock_token_regressions_total` | counter | | `backend` | grants whose token was not above one this client had already seen for that lock (a Redis token counter evicted or flushed); the counter is moved forward and the grant gets a newer token |
//!
//! `backend` is `etcd`, `redis`, `redlock`, `postgres` or `zookeeper`; the acquisition `outcome` is
//! `acquired`, `busy` (a `try_lock` that found the lock taken), `timeout` (the wait
//! timeout ran out) or `error`; `kind` is `timeout`, `unavailable`, `permission_denied`,
//! `tls`, `invalid_input`, `lost` or `other`.
//!
//! Lock names are not labels by default: a service that names locks after orders or users
//! would create a series per name. [`label_lock_names`] adds a `lock` label to the
//! acquisition histogram and the grant counter, for services with a small fixed set of
//! names.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use crate::{Backend, LockError, LossReason};

mod static_key;

/// Metric names, for dashboards and tests.
pub mod names {
    /// Histogram: seconds from an acquisition's call to its result.
    pub const ACQUIRE_SECONDS: &str = "fencelock_acquire_seconds";
    /// Counter: locks granted.
    pub const GRANTS: &str = "fencelock_grants_total";
    /// Gauge: guards alive now.
    pub const LOCKS_HELD: &str = "fencelock_locks_held";
    /// Histogram: seconds from the grant to the guard's release or drop.
    pub const HOLD_SECONDS: &str = "fencelock_hold_seconds";
    /// Counter: releases, by outcome.
    pub const RELEASES: &str = "fencelock_releases_total";
    /// Counter: held locks lost, by reason.
    pub const LOSSES: &str = "fencelock_losses_total";
    /// Counter: lease renewals, by outcome.
    pub const RENEWALS: &str = "fencelock_renewals_total";
    /// Counter: errors returned to callers, by operation and kind.
    pub const ERRORS: &str = "fencelock_errors_total";
    /// Counter: grants whose token had gone backwards (a Redis counter evicted or flushed).
    pub const TOKEN_REGRESSIONS: &str = "fencelock_token_regressions_total";
}

static LOCK_NAMES: AtomicBool = AtomicBool::new(false);

/// The keys of the reports made on every acquisition, release and hold, built once each
/// (see [`static_key`]).
static ACQUIRE_KEYS: static_key::Keys<4> = static_key::Keys::new(names::ACQUIRE_SECONDS);
static GRANT_KEYS: static_key::Keys<1> = static_key::Keys::new(names::GRANTS);
static RELEASE_KEYS: static_key::Keys<4> = static_key::Keys::new(names::RELEASES);
static HELD_KEYS: static_key::Keys<1> = static_key::Keys::new(names::LOCKS_HELD);
static HOLD_KEYS: static_key::Keys<1> = static_key::Keys::new(names::HOLD_SECONDS);

/// Adds a `lock` label (the lock's name) to `fencelock_acquire_seconds` and
/// `fencelock_grants_total` from now on, process-wide. Off by default: only for a small,
/// fixed set of lock names, since every name becomes a series of its own.
pub fn label_lock_names(on: bool) {
    LOCK_NAMES.store(on, Ordering::Relaxed);
}

/// Records an acquisition's result and how long it took; errors are counted too.
///
/// On the acquisition path: by default every label is a `&'static str`, so nothing is
/// allocated; only opted-in lock names are copied.
pub(crate) fn acquisition<T>(
    backend: Backend,
    name: &str,
    started: Instant,
    result: &Result<Option<T>, LockError>,
) {
    let (outcome_index, outcome) = match result {
        Ok(Some(_)) => (0, "acquired"),
        Ok(None) => (1, "busy"),
        Err(err) if err.is_wait_timeout() => (2, "timeout"),
        Err(_) => (3, "error"),
    };
    let waited = started.elapsed().as_secs_f64();
    let granted = matches!(result, Ok(Some(_)));
    if LOCK_NAMES.load(Ordering::Relaxed) {
        let backend_label = backend.as_str();
        let lock = name.to_owned();
        ::metrics::histogram!(
            names::ACQUIRE_SECONDS,
            "backend" => backend_label,
            "outcome" => outcome,
            "lock" => lock.clone(),
        )
        .record(waited);
        if granted {
            ::metrics::counter!(names::GRANTS, "backend" => backend_label, "lock" => lock)
                .increment(1);
        }
    } else {
        let key = ACQUIRE_KEYS.labelled(backend, outcome_index, "outcome", outcome);
        static_key::histogram(&key).record(waited);
        if granted {
            static_key::counter(&GRANT_KEYS.backend(backend)).increment(1);
        }
    }
    if let Err(err) = result {
        if !err.is_wait_timeout() {
            error(backend, "acquire", err);
        }
    }
}

/// Counts an error returned to a caller.
pub(crate) fn error(backend: Backend, operation: &'static str, err: &LockError) {
    ::metrics::counter!(
        names::ERRORS,
        "backend" => backend.as_str(),
        "operation" => operation,
        "kind" => kind(err),
    )
    .increment(1);
}

fn kind(err: &LockError) -> &'static str {
    if err.is_timeout() {
        "timeout"
    } else if err.is_permission_denied() {
        "permission_denied"
    } else if err.is_tls() {
        "tls"
    } else if err.is_unavailable() {
        "unavailable"
    } else if err.is_invalid_input() {
        "invalid_input"
    } else if err.is_lost() {
        "lost"
    } else {
        "other"
    }
}

/// How a release ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Release {
    /// The key was removed.
    Released,
    /// The lock was found lost.
    NotHeld,
    /// The release failed (also counted as an error).
    Failed,
    /// The guard was dropped without `release()`.
    Dropped,
}

/// Counts a release.
pub(crate) fn release(backend: Backend, outcome: Release) {
    let (index, outcome) = match outcome {
        Release::Released => (0, "released"),
        Release::NotHeld => (1, "not_held"),
        Release::Failed => (2, "error"),
        Release::Dropped => (3, "dropped"),
    };
    let key = RELEASE_KEYS.labelled(backend, index, "outcome", outcome);
    static_key::counter(&key).increment(1);
}

/// Counts renewals of leases: `ok` confirmed, `failed` not (an error, no answer, or no
/// quorum; the lease may still live).
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) fn renewals(backend: Backend, ok: usize, failed: usize) {
    for (outcome, count) in [("ok", ok), ("failed", failed)] {
        if count > 0 {
            ::metrics::counter!(names::RENEWALS, "backend" => backend.as_str(), "outcome" => outcome)
                .increment(u64::try_from(count).unwrap_or(u64::MAX));
        }
    }
}

/// Counts a token counter found to have gone backwards.
#[cfg(feature = "redis")]
pub(crate) fn token_regression(backend: Backend) {
    ::metrics::counter!(names::TOKEN_REGRESSIONS, "backend" => backend.as_str()).increment(1);
}

/// Counts `holders` held locks lost at once (every guard on one lease).
pub(crate) fn lost(backend: Backend, reason: LossReason, holders: usize) {
    if holders == 0 {
        return;
    }
    let reason = match reason {
        LossReason::Expired => "expired",
        LossReason::Revoked => "revoked",
        LossReason::Closed => "closed",
        LossReason::Disconnected => "disconnected",
        LossReason::KeyDeleted => "key_deleted",
        LossReason::Unwatched => "unwatched",
        LossReason::Unrenewed => "unrenewed",
    };
    ::metrics::counter!(names::LOSSES, "backend" => backend.as_str(), "reason" => reason)
        .increment(u64::try_from(holders).unwrap_or(u64::MAX));
}

/// One guard's hold, from the grant to the guard's end: the held gauge, the hold time,
/// and the count of holders a loss of their lease affects. Kept inside the guard; its
/// drop ends the hold.
#[derive(Debug)]
pub(crate) struct Holding {
    backend: Backend,
    since: Instant,
    holders: Arc<AtomicUsize>,
    /// Set once this hold has left its lease's count: counted as lost on its own
    /// (`HoldingLoss`), or ended. Made only when a `HoldingLoss` is asked for (etcd): a
    /// hold nothing else can end (Redis) costs no allocation for it.
    left: std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>>,
}

impl Holding {
    /// Starts a hold on a lease whose guards `holders` counts.
    pub(crate) fn start(backend: Backend, holders: Arc<AtomicUsize>) -> Self {
        holders.fetch_add(1, Ordering::Relaxed);
        static_key::gauge(&HELD_KEYS.backend(backend)).increment(1.0);
        Self {
            backend,
            since: Instant::now(),
            holders,
            left: std::sync::OnceLock::new(),
        }
    }

    /// A handle that counts this one hold as lost (its key deleted while its lease
    /// lives), taking it out of its lease's count so that a later loss of the lease does
    /// not count it again. Only etcd can lose one hold while its lease lives.
    #[cfg(feature = "etcd")]
    pub(crate) fn loss(&self) -> HoldingLoss {
        HoldingLoss {
            backend: self.backend,
            holders: self.holders.clone(),
            left: self.left.get_or_init(Arc::default).clone(),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        // Without a `HoldingLoss` nothing else can take this hold out of the count.
        let counted = self
            .left
            .get()
            .is_none_or(|left| !left.swap(true, Ordering::AcqRel));
        if counted {
            self.holders.fetch_sub(1, Ordering::Relaxed);
        }
        static_key::gauge(&HELD_KEYS.backend(self.backend)).decrement(1.0);
        static_key::histogram(&HOLD_KEYS.backend(self.backend))
            .record(self.since.elapsed().as_secs_f64());
    }
}

/// Counts one hold as lost on its own; see `Holding::loss`.
#[cfg(feature = "etcd")]
#[derive(Clone, Debug)]
pub(crate) struct HoldingLoss {
    backend: Backend,
    holders: Arc<AtomicUsize>,
    left: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(feature = "etcd")]
impl HoldingLoss {
    /// Counts the loss, once, unless the hold has ended or was counted already.
    pub(crate) fn count(&self, reason: LossReason) {
        if !self.left.swap(true, Ordering::AcqRel) {
            self.holders.fetch_sub(1, Ordering::Relaxed);
            lost(self.backend, reason, 1);
        }
    }
}
