//! One renewal task per client, for all the locks it holds.
//!
//! Every tick (a third of the shortest TTL held) it renews every held lock on every node
//! in one pipeline per node, one script call per chunk of 1,000 locks: a client holding
//! 1,000 locks sends one command per tick, not 1,000 timers' worth. A lock that a quorum
//! of nodes no longer holds for us is marked lost at once; one that cannot be renewed
//! (nodes unreachable) is marked lost when its local deadline passes.
//!
//! A renewal that fails or gets no answer within [`attempt_wait`] is retried after a short
//! backoff ([`backoff`]), not a whole tick later: one dropped connection, a Redis restart
//! or one lost answer must not cost a healthy holder its lock (issue 21).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use super::node::Node;
use crate::lease_clock::{Clock, ClockInstant, LeaseClock, RECHECK};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::retry::{answer_wait, backoff};
use crate::{Backend, LockError, LossReason};

/// Never tick more often than this, whatever the TTLs.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

struct Held {
    key: Arc<str>,
    owner: Arc<str>,
    ttl: Duration,
    renew: bool,
    notifier: LossNotifier,
    clock: Arc<LeaseClock>,
}

struct Shared {
    backend: Backend,
    nodes: Arc<[Node]>,
    quorum: usize,
    drift_factor: f64,
    /// The configured request timeout: no renewal attempt waits longer than this.
    request_timeout: Duration,
    held: Mutex<HashMap<u64, Held>>,
    next_id: AtomicU64,
    changed: Notify,
    /// When the task next wakes, in nanoseconds since `base`: a new lock wakes the task
    /// only if it needs attention sooner, so taking a lock costs no scan of the others.
    planned_wake: AtomicU64,
    /// A lock was registered with so little of its TTL left that it must be renewed at
    /// once, not a tick from now: the next plan ticks at once (and clears this).
    renew_now: AtomicBool,
    base: Instant,
}

impl Shared {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Handle to the renewal task; the task stops when the handle is dropped.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

/// What a held lock keeps from its registration.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) id: u64,
    pub(crate) loss: LossWatch,
    pub(crate) clock: Arc<LeaseClock>,
}

impl Renewer {
    pub(crate) fn start(
        backend: Backend,
        nodes: Arc<[Node]>,
        quorum: usize,
        drift_factor: f64,
        request_timeout: Duration,
    ) -> Self {
        let shared = Arc::new(Shared {
            backend,
            nodes,
            quorum,
            drift_factor,
            request_timeout,
            held: Mutex::default(),
            next_id: AtomicU64::new(1),
            changed: Notify::new(),
            planned_wake: AtomicU64::new(u64::MAX),
            renew_now: AtomicBool::new(false),
            base: Instant::now(),
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(run(shared.clone(), stop_rx));
        Self {
            shared,
            _stop: stop_tx,
        }
    }

    /// The safety margin subtracted from a TTL for clock drift between us and the servers.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        drift(ttl, self.shared.drift_factor)
    }

    /// Starts tracking a lock granted by a request sent at `sent` (on [`Clock::BOOT`]).
    /// With `renew` it is renewed every tick; either way it is reported lost when its time
    /// runs out.
    pub(crate) fn register(
        &self,
        key: Arc<str>,
        owner: Arc<str>,
        ttl: Duration,
        renew: bool,
        sent: ClockInstant,
    ) -> Registration {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let deadline = sent + ttl.saturating_sub(self.drift(ttl));
        let clock = Arc::new(LeaseClock::new(Clock::BOOT, deadline));
        let expires = Clock::BOOT.tokio_instant(deadline);
        let interval = (ttl / 3).max(MIN_INTERVAL);
        // Acquired late (the answer took long, and the deadline counts from the sending):
        // waiting a whole interval for the first renewal would leave less than one to
        // confirm it, or pass the deadline (`tests/redis/late_answer.rs`). A renewal
        // already in flight is waited for first (at most its answer wait); a lock with
        // nothing left is reported lost, not renewed. Acquisitions that are all late (a
        // link slower than a third of the TTL) make renewal rounds follow each other at
        // once rather than a tick apart: one round in flight at a time, never a loop.
        let left = clock.remaining();
        let late = renew && !left.is_zero() && left < interval * 2;
        let needs = if late {
            Instant::now()
        } else if renew {
            expires.min(Instant::now() + interval)
        } else {
            expires
        };
        let (notifier, loss) = loss_channel(self.shared.backend);
        let needs = self.shared.nanos(needs);
        let wake = {
            // Under the map's lock, so that the task's plan and this check cannot cross.
            let mut held = held(&self.shared);
            held.insert(
                id,
                Held {
                    key,
                    owner,
                    ttl,
                    renew,
                    notifier,
                    clock: clock.clone(),
                },
            );
            if late {
                // After the insert, under the map's lock (as `plan` reads it): the tick
                // this asks for renews a snapshot that has this lock.
                self.shared.renew_now.store(true, Ordering::Release);
            }
            needs < self.shared.planned_wake.fetch_min(needs, Ordering::AcqRel)
        };
        if wake {
            self.shared.changed.notify_one();
        }
        Registration { id, loss, clock }
    }

    /// Stops tracking a lock (it is being released).
    pub(crate) fn unregister(&self, id: u64) {
        held(&self.shared).remove(&id);
    }

    /// How many locks are tracked.
    pub(crate) fn len(&self) -> usize {
        held(&self.shared).len()
    }
}

fn held(shared: &Shared) -> MutexGuard<'_, HashMap<u64, Held>> {
    shared.held.lock().unwrap_or_else(PoisonError::into_inner)
}

fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor) + Duration::from_millis(2)
}

const FAR: Duration = Duration::from_secs(24 * 60 * 60);

/// How long one renewal attempt may go unanswered before it is given up and retried:
/// [`answer_wait`] of the renewal `interval`, never more than the interval itself, nor the
/// request timeout.
fn attempt_wait(interval: Duration, request_timeout: Duration) -> Duration {
    answer_wait(interval).min(interval).min(request_timeout)
}

async fn run(shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut next_tick = Instant::now() + FAR;
    // Failed or unanswered renewal attempts in a row.
    let mut failures = 0u32;
    loop {
        let earliest;
        (next_tick, earliest) = plan(&shared, next_tick);
        tokio::select! {
            biased;
            _ = &mut stop => return,
            () = shared.changed.notified() => {}
            () = tokio::time::sleep_until(earliest) => expire_due(&shared),
            () = tokio::time::sleep_until(next_tick) => {
                // A renewal can hang for the request timeout (a partition); deadlines
                // passing meanwhile must still be reported on time, not when it returns,
                // including the deadlines of locks registered while it hangs.
                let wait = attempt_wait(schedule(&held(&shared)).0, shared.request_timeout);
                let renewal = renew_all(&shared, wait);
                tokio::pin!(renewal);
                let confirmed = loop {
                    let earliest = plan_during_renewal(&shared);
                    tokio::select! {
                        biased;
                        _ = &mut stop => return,
                        confirmed = &mut renewal => break confirmed,
                        () = shared.changed.notified() => {}
                        () = tokio::time::sleep_until(earliest) => expire_due(&shared),
                    }
                };
                expire_due(&shared);
                // Ticks follow from the last one; `plan` only ever brings them forward. A
                // renewal that was not confirmed is retried soon, not a tick later.
                next_tick = if confirmed {
                    failures = 0;
                    Instant::now() + FAR
                } else {
                    failures = failures.saturating_add(1);
                    let pause = backoff(failures, wait);
                    tracing::debug!(failures, ?pause, "renewal not confirmed; retrying");
                    Instant::now() + pause
                };
            }
        }
    }
}

/// The next tick (no later than `next_tick`) and when to check the deadlines next, with
/// the wake-up time published under the map's lock.
fn plan(shared: &Shared, next_tick: Instant) -> (Instant, Instant) {
    let held = held(shared);
    let (interval, earliest) = schedule(&held);
    let next_tick = if shared.renew_now.swap(false, Ordering::AcqRel) {
        // Once per late registration: a renewal that then fails is retried on the usual
        // backoff, not in a loop.
        Instant::now()
    } else {
        next_tick.min(Instant::now() + interval)
    };
    shared
        .planned_wake
        .store(shared.nanos(next_tick.min(earliest)), Ordering::Release);
    (next_tick, earliest)
}

/// While a renewal is in flight there is no tick to plan: only deadlines, published so
/// that a lock registered meanwhile with an earlier one wakes the task.
fn plan_during_renewal(shared: &Shared) -> Instant {
    let held = held(shared);
    let earliest = schedule(&held).1;
    shared
        .planned_wake
        .store(shared.nanos(earliest), Ordering::Release);
    earliest
}

/// (tick interval, when to check the deadlines next) over the tracked locks. Deadlines
/// are on the suspend-aware clock, timers are not: with locks held, look at least every
/// [`RECHECK`].
fn schedule(held: &HashMap<u64, Held>) -> (Duration, Instant) {
    let interval = held
        .values()
        .filter(|h| h.renew)
        .map(|h| (h.ttl / 3).max(MIN_INTERVAL))
        .min()
        .unwrap_or(FAR);
    let earliest = held
        .values()
        .map(|h| h.clock.deadline())
        .min()
        .map(|deadline| {
            Clock::BOOT
                .tokio_instant(deadline)
                .min(Instant::now() + RECHECK)
        })
        .unwrap_or_else(|| Instant::now() + FAR);
    (interval, earliest)
}

/// One renewal attempt of every renewing lock, each node's answer awaited at most `wait`.
/// `true` if every lock was either renewed or found no longer ours; `false` if some are
/// left unconfirmed (too few nodes answered in time), so the attempt should be retried.
async fn renew_all(shared: &Shared, wait: Duration) -> bool {
    // Shared names (`Arc<str>`): taking this snapshot under the lock copies no strings.
    let batch: Vec<(u64, Arc<str>, Arc<str>, Duration)> = held(shared)
        .iter()
        .filter(|(_, h)| h.renew)
        .map(|(id, h)| (*id, h.key.clone(), h.owner.clone(), h.ttl))
        .collect();
    if batch.is_empty() {
        return true;
    }
    let items: Vec<(&str, &str, Duration)> = batch
        .iter()
        .map(|(_, key, owner, ttl)| (&**key, &**owner, *ttl))
        .collect();
    let sent = Clock::BOOT.now();
    // Decided as soon as every lock is: a master that stops answering must not hold up
    // the others' answers (Redlock, issue 21). Requests left unanswered are dropped; one
    // already sent may still be applied, which only extends a lock that is still ours.
    let mut pending: FuturesUnordered<_> = shared
        .nodes
        .iter()
        .map(|node| {
            let renewal = node.renew(&items);
            async move {
                tokio::time::timeout(wait, renewal)
                    .await
                    .unwrap_or(Err(LockError::Timeout {
                        backend: shared.backend,
                        operation: "renew",
                        lock: None,
                        after: wait,
                    }))
            }
            .instrument(tracing::debug_span!("renew", node = %node.address, locks = items.len()))
        })
        .collect();
    let mut replies = Vec::with_capacity(shared.nodes.len());
    while let Some(reply) = pending.next().await {
        replies.push(reply);
        if all_decided(&replies, batch.len(), shared.quorum, shared.nodes.len()) {
            break;
        }
    }
    drop(pending);
    let node_count = shared.nodes.len();
    let mut held = held(shared);
    let mut renewed = 0;
    let mut unconfirmed = 0;
    for (i, (id, _, _, ttl)) in batch.iter().enumerate() {
        let mut yes = 0;
        let mut no = 0;
        for reply in &replies {
            match reply.as_ref().map(|r| r.get(i).copied()) {
                Ok(Some(true)) => yes += 1,
                Ok(_) => no += 1,
                Err(_) => {}
            }
        }
        let Some(lock) = held.get(id) else { continue };
        if yes >= shared.quorum {
            renewed += 1;
            lock.clock
                .extend_to(sent + ttl.saturating_sub(drift(*ttl, shared.drift_factor)));
        } else if no > node_count - shared.quorum {
            // Enough servers say the lock is no longer ours that a quorum cannot.
            tracing::warn!(key = %lock.key, "lock no longer ours at renewal");
            lock.notifier.mark(LossReason::Revoked);
            held.remove(id);
        } else {
            unconfirmed += 1;
        }
    }
    drop(held);
    // Counted once per tick, not per lock: a client holding 100,000 locks makes two
    // counter updates a tick.
    crate::metrics::renewals(shared.backend, renewed, batch.len() - renewed);
    for reply in replies {
        if let Err(err) = reply {
            tracing::debug!(%err, "renewal failed on a node");
        }
    }
    unconfirmed == 0
}

/// Whether the `replies` so far settle every one of `locks` locks: renewed by `quorum`
/// nodes, or refused by so many that a quorum cannot renew it.
fn all_decided(
    replies: &[Result<Vec<bool>, LockError>],
    locks: usize,
    quorum: usize,
    nodes: usize,
) -> bool {
    (0..locks).all(|i| {
        let (mut yes, mut no) = (0, 0);
        for reply in replies {
            match reply.as_ref().map(|r| r.get(i).copied()) {
                Ok(Some(true)) => yes += 1,
                Ok(_) => no += 1,
                Err(_) => {}
            }
        }
        yes >= quorum || no > nodes - quorum
    })
}

fn expire_due(shared: &Shared) {
    held(shared).retain(|_, lock| {
        if lock.clock.has_passed() {
            lock.notifier.mark(LossReason::Expired);
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_renewal_is_given_up_within_a_third_of_the_interval_bounded() {
        let long = Duration::from_secs(2);
        assert_eq!(
            attempt_wait(Duration::from_secs(10) / 3, long),
            Duration::from_secs(1)
        );
        assert_eq!(
            attempt_wait(Duration::from_secs(1), long),
            Duration::from_secs(1) / 3
        );
        assert_eq!(
            attempt_wait(Duration::from_millis(600), long),
            Duration::from_millis(250)
        );
        assert_eq!(
            attempt_wait(Duration::from_millis(100), long),
            Duration::from_millis(100)
        );
        assert_eq!(
            attempt_wait(Duration::from_secs(10), Duration::from_millis(300)),
            Duration::from_millis(300)
        );
    }
}
