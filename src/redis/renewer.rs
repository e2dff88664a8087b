//! One renewal task per client, for all the locks it holds.
//!
//! Every tick (a third of the shortest TTL held) it renews every held lock on every node,
//! one script call per chunk of 1,000 locks, a few in flight at a time
//! (`node_renewal.rs`): a client holding 1,000 locks sends one command per tick, not
//! 1,000 timers' worth. A lock that a quorum of nodes no longer holds for us is marked
//! lost at once; one that cannot be renewed (nodes unreachable) is marked lost when its
//! local deadline passes.
//!
//! A renewal that fails, or that a node leaves without an answer for [`attempt_wait`]
//! (from one call's answer to the next: a round of many locks may take longer), is
//! retried after a short backoff ([`backoff`]), not a whole tick later: one dropped
//! connection, a Redis restart or one lost answer must not cost a healthy holder its
//! lock (issue 21). Rounds follow a tick after each other's start, soonest deadline
//! first; with Redlock a round is decided once a quorum has answered, and the slower
//! masters get the rest of it in the background until the next full round
//! (`tests/redis/renewal_slow_link.rs`).

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
use super::node_renewal::{NodeRenewal, Renewing, WINDOW};
use crate::lease_clock::{Clock, ClockInstant, LeaseClock, RECHECK};
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::retry::{answer_wait, backoff};
use crate::{Backend, LossReason};

/// Never tick more often than this, whatever the TTLs.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

struct Held {
    key: Arc<str>,
    owner: Arc<str>,
    ttl: Duration,
    renew: bool,
    /// Registered with less than two intervals of its TTL left (answered late): renewed
    /// in the next round, alone with the other urgent locks if no full round is due, and
    /// also without `renew` (once: it then keeps its whole TTL, as etcd's does), until a
    /// renewal of it is confirmed.
    urgent: bool,
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
    /// once, not a tick from now: the next plan ticks at once, and the round that takes
    /// its snapshot clears this (under the map's lock, as it is set).
    renew_now: AtomicBool,
    /// How long each node's renewal calls left unanswered by its last attempt may still
    /// take, in nanoseconds (`node_renewal.rs`).
    ahead: Arc<[AtomicU64]>,
    base: Instant,
}

impl Shared {
    /// Nothing held yet, no wake-up planned.
    fn new(
        backend: Backend,
        nodes: Arc<[Node]>,
        quorum: usize,
        drift_factor: f64,
        request_timeout: Duration,
    ) -> Self {
        Self {
            backend,
            quorum,
            drift_factor,
            request_timeout,
            held: Mutex::default(),
            next_id: AtomicU64::new(1),
            changed: Notify::new(),
            planned_wake: AtomicU64::new(u64::MAX),
            renew_now: AtomicBool::new(false),
            ahead: nodes.iter().map(|_| AtomicU64::new(0)).collect(),
            nodes,
            base: Instant::now(),
        }
    }

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
        let shared = Arc::new(Shared::new(
            backend,
            nodes,
            quorum,
            drift_factor,
            request_timeout,
        ));
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
    /// With `renew` it is renewed every tick; either way it is renewed at once if it was
    /// answered late, and reported lost when its time runs out.
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
        // confirm it, or pass the deadline; a lock without renewal would keep only what is
        // left of its TTL (`tests/redis/late_answer.rs`). It is renewed in a round of the
        // urgent locks alone, at once (after a round in flight: a tick of its locks at
        // most, as much as a server that keeps answering needs to carry it);
        // a lock with nothing left is reported lost, not renewed. Acquisitions that are
        // all late (a link slower than a third of the TTL) make such rounds follow each
        // other, each of the locks not yet confirmed: one round in flight at a time,
        // never a loop.
        let left = clock.remaining();
        let late = !left.is_zero() && left < interval * 2;
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
                    urgent: late,
                    notifier,
                    clock: clock.clone(),
                },
            );
            if late {
                // After the insert, under the map's lock (as `plan` reads it and the
                // round's snapshot clears it): the round this asks for has this lock.
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

/// How long a node may leave a renewal attempt without an answer (to its next script
/// call) before the attempt is given up and retried: [`answer_wait`] of the renewal
/// `interval`, never more than the interval itself, nor the request timeout.
fn attempt_wait(interval: Duration, request_timeout: Duration) -> Duration {
    answer_wait(interval).min(interval).min(request_timeout)
}

async fn run(shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    // The next full round: ticks follow from the last one; `plan` only brings them forward.
    let mut next_tick = Instant::now() + FAR;
    // Failed or unanswered renewal attempts in a row.
    let mut failures = 0u32;
    loop {
        let planned = plan(&shared, next_tick);
        next_tick = planned.full;
        tokio::select! {
            biased;
            _ = &mut stop => return,
            () = shared.changed.notified() => {}
            () = tokio::time::sleep_until(planned.earliest) => expire_due(&shared),
            () = tokio::time::sleep_until(planned.tick) => {
                // A renewal can hang for the request timeout (a partition); deadlines
                // passing meanwhile must still be reported on time, not when it returns,
                // including the deadlines of locks registered while it hangs.
                let (round, tick) = {
                    let held = held(&shared);
                    (round_interval(&held, planned.urgent_only), tick_interval(&held))
                };
                let wait = attempt_wait(round, shared.request_timeout);
                let started = Instant::now();
                let renewal = renew_all(&shared, wait, planned.urgent_only, started + tick);
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
                next_tick = after_round(
                    Instant::now(),
                    next_tick,
                    planned.urgent_only,
                    confirmed,
                    &mut failures,
                    wait,
                    started + tick,
                );
            }
        }
    }
}

/// The next full round after a round that ended `now` (`next_full` as planned before it,
/// `wait` its answer wait, `a_tick_on` a tick after its start). A renewal that was not
/// confirmed is retried soon (as a full round), not a tick later. A round of the urgent
/// locks alone leaves the full round where it was, or brings it forward for the retry:
/// never later (the locks it did not have are due then); only a confirmed full round ends
/// a run of failures.
///
/// A confirmed full round is followed by the next a tick after its start, not after its
/// end (at once if it took longer): its renewals count from its start, so a long round
/// (many locks, a busy server) would otherwise eat into the time after the next one too
/// and lose locks it renewed (a round taking a third of the TTL was enough).
#[allow(clippy::too_many_arguments)]
fn after_round(
    now: Instant,
    next_full: Instant,
    urgent_only: bool,
    confirmed: bool,
    failures: &mut u32,
    wait: Duration,
    a_tick_on: Instant,
) -> Instant {
    if !confirmed {
        *failures = failures.saturating_add(1);
        let pause = backoff(*failures, wait);
        tracing::debug!(
            failures = *failures,
            ?pause,
            "renewal not confirmed; retrying"
        );
        let retry = now + pause;
        return if urgent_only {
            next_full.min(retry)
        } else {
            retry
        };
    }
    if urgent_only {
        return next_full;
    }
    *failures = 0;
    a_tick_on
}

/// What the task waits for next.
struct Planned {
    /// The next full round (no later than asked, nor than an interval from now).
    full: Instant,
    /// The next round: the full one, or at once for urgent locks alone.
    tick: Instant,
    /// Whether the next round renews only the urgent locks (a full one is not due yet).
    urgent_only: bool,
    /// When to check the deadlines next.
    earliest: Instant,
}

/// The next rounds and deadline check, with the wake-up time published under the map's
/// lock.
fn plan(shared: &Shared, next_tick: Instant) -> Planned {
    let held = held(shared);
    let (interval, earliest) = schedule(&held);
    let now = Instant::now();
    let full = next_tick.min(now + interval);
    // Left set until a round's snapshot takes it (under this lock): a plan made again
    // before the tick (another registration woke the task) still ticks at once. A round
    // that then fails is retried on the usual backoff, not in a loop.
    let urgent = shared.renew_now.load(Ordering::Acquire);
    let (tick, urgent_only) = if urgent && full > now {
        (now, true)
    } else {
        (full, false)
    };
    shared
        .planned_wake
        .store(shared.nanos(tick.min(earliest)), Ordering::Release);
    Planned {
        full,
        tick,
        urgent_only,
        earliest,
    }
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

/// The interval of full rounds: a third of the shortest TTL of the renewing locks.
fn tick_interval(held: &HashMap<u64, Held>) -> Duration {
    held.values()
        .filter(|h| h.renew)
        .map(|h| (h.ttl / 3).max(MIN_INTERVAL))
        .min()
        .unwrap_or(FAR)
}

/// (tick interval, when to check the deadlines next) over the tracked locks. Deadlines
/// are on the suspend-aware clock, timers are not: with locks held, look at least every
/// [`RECHECK`].
fn schedule(held: &HashMap<u64, Held>) -> (Duration, Instant) {
    let interval = tick_interval(held);
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

/// One renewal attempt of every renewing and every urgent lock (of the urgent ones alone
/// with `urgent_only`); a node is given up once it leaves the attempt `wait` without an
/// answer. `true` if every lock was either renewed or found no longer ours; `false` if
/// some are left unconfirmed (too few nodes answered in time), so the attempt should be
/// retried. The nodes not needed for the decision (Redlock) get the rest of the round in
/// the background, until `until` (the next full round).
///
/// Each lock's renewal counts from the round's start (`sent`), however long the round
/// takes: a server may have extended a key at any time since. A round longer than what
/// a lock has left loses it, renewed or not: a server (or link) that cannot carry the
/// client's locks within a third of their TTL cannot keep them. The locks go out
/// soonest deadline first: an attempt that fails partway leaves out the locks renewed
/// most lately, and the retry starts with those it left, never starving the same ones
/// attempt after attempt.
async fn renew_all(shared: &Shared, wait: Duration, urgent_only: bool, until: Instant) -> bool {
    let batch = snapshot(shared, urgent_only);
    if batch.is_empty() {
        return true;
    }
    let locks: Arc<[Renewal]> = batch.iter().map(|(_, lock)| lock.clone()).collect();
    let sent = Clock::BOOT.now();
    let mut pending: FuturesUnordered<_> = shared
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let span = tracing::debug_span!("renew", node = %node.address, locks = locks.len());
            let (node, locks) = (node.clone(), locks.clone());
            let ahead = Duration::from_nanos(shared.ahead[i].load(Ordering::Acquire));
            async move {
                let items: Vec<Renewing<'_>> = locks
                    .iter()
                    .map(|(key, owner, ttl)| (&**key, &**owner, *ttl))
                    .collect();
                (i, node.renew(&items, wait, ahead).await)
            }
            .instrument(span)
        })
        .collect();
    // Decided as soon as every lock is: a master that stops answering must not hold up
    // the others' answers (Redlock, issue 21).
    let mut replies = Vec::with_capacity(shared.nodes.len());
    let mut replies_from = Vec::with_capacity(shared.nodes.len());
    while let Some((i, reply)) = pending.next().await {
        noted(&shared.ahead, i, &reply);
        replies.push(reply);
        replies_from.push(i);
        if all_decided(&replies, batch.len(), shared.quorum, shared.nodes.len()) {
            break;
        }
    }
    let confirmed = decide(shared, &batch, &replies, sent);
    // The other masters still get the rest of the round, until its time is up (before
    // the next full round), in the background. A master sent only part of it would let
    // its copies of the rest expire, and from then on one master's fault (a restart
    // without persistence, a clock jump) would cost those locks a quorum, or let another
    // client take them.
    if !pending.is_empty() {
        let ahead = shared.ahead.clone();
        // Cut off at `until`, a node's attempt leaves a window's calls unanswered, each
        // answered within the wait (or it would have ended); one that ends sooner says
        // how long its own may take.
        let cut = nanos(wait.saturating_mul(u32::try_from(WINDOW).unwrap_or(u32::MAX)));
        for (i, _) in shared.nodes.iter().enumerate() {
            if !replies_from.contains(&i) {
                ahead[i].store(cut, Ordering::Release);
            }
        }
        let rest = async move {
            while let Some((i, reply)) = pending.next().await {
                noted(&ahead, i, &reply);
            }
        };
        tokio::spawn(async move { tokio::time::timeout_at(until, rest).await });
    }
    confirmed
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A lock of a round: its key, its owner value, its TTL.
type Renewal = (Arc<str>, Arc<str>, Duration);

/// Keeps what node `i`'s attempt left unanswered for its next one, and logs its failure.
fn noted(ahead: &[AtomicU64], i: usize, reply: &NodeRenewal) {
    ahead[i].store(nanos(reply.ahead), Ordering::Release);
    if let Some(failure) = &reply.failure {
        tracing::debug!(err = %failure, "renewal failed on a node");
    }
}

/// Applies a round's `replies` to its `batch` of locks, sent at `sent`: a lock renewed by
/// a quorum has its deadline moved on, one that enough nodes say is no longer ours is
/// reported lost. `true` if none is left unconfirmed.
fn decide(
    shared: &Shared,
    batch: &[(u64, Renewal)],
    replies: &[NodeRenewal],
    sent: ClockInstant,
) -> bool {
    let node_count = shared.nodes.len();
    let mut held = held(shared);
    let mut renewed = 0;
    let mut unconfirmed = 0;
    for (i, (id, (_, _, ttl))) in batch.iter().enumerate() {
        let (yes, no) = tally(replies, i);
        let Some(lock) = held.get_mut(id) else {
            continue;
        };
        if yes >= shared.quorum {
            renewed += 1;
            lock.urgent = false;
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
    unconfirmed == 0
}

/// Whether a round renews `lock`: every renewing and every urgent lock, or the urgent ones
/// alone.
fn in_round(lock: &Held, urgent_only: bool) -> bool {
    lock.urgent || (lock.renew && !urgent_only)
}

/// The shortest renewal interval of the locks a round renews: what its answers may be
/// waited for, its time bounded by, and its retry paced by.
fn round_interval(held: &HashMap<u64, Held>, urgent_only: bool) -> Duration {
    held.values()
        .filter(|h| in_round(h, urgent_only))
        .map(|h| (h.ttl / 3).max(MIN_INTERVAL))
        .min()
        .unwrap_or(FAR)
}

/// The locks a round renews ([`in_round`]), soonest deadline first, taken under the
/// map's lock, where the renew-now flag is cleared: every urgent lock registered so far
/// is in it, and one registered after it sets the flag again. Shared names (`Arc<str>`):
/// no string is copied. Sorted after the lock is let go (100,000 locks: milliseconds).
fn snapshot(shared: &Shared, urgent_only: bool) -> Vec<(u64, Renewal)> {
    let mut batch: Vec<_> = {
        let held = held(shared);
        shared.renew_now.store(false, Ordering::Release);
        held.iter()
            .filter(|(_, h)| in_round(h, urgent_only))
            .map(|(id, h)| {
                let lock = (h.key.clone(), h.owner.clone(), h.ttl);
                (h.clock.deadline(), (*id, lock))
            })
            .collect()
    };
    batch.sort_unstable_by_key(|(deadline, _)| *deadline);
    batch.into_iter().map(|(_, lock)| lock).collect()
}

/// Whether the `replies` so far settle every one of `locks` locks: renewed by `quorum`
/// nodes, or refused by so many that a quorum cannot renew it.
fn all_decided(replies: &[NodeRenewal], locks: usize, quorum: usize, nodes: usize) -> bool {
    (0..locks).all(|i| {
        let (yes, no) = tally(replies, i);
        yes >= quorum || no > nodes - quorum
    })
}

/// How many nodes renewed the round's lock `i`, and how many found it no longer ours.
fn tally(replies: &[NodeRenewal], i: usize) -> (usize, usize) {
    replies
        .iter()
        .filter_map(|reply| reply.answer(i))
        .fold((0, 0), |(yes, no), renewed| {
            if renewed {
                (yes + 1, no)
            } else {
                (yes, no + 1)
            }
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

    fn shared() -> Shared {
        Shared::new(
            Backend::Redis,
            Arc::from(Vec::new()),
            1,
            0.01,
            Duration::from_secs(1),
        )
    }

    fn hold(shared: &Shared, id: u64, renew: bool, urgent: bool) {
        let deadline = Clock::BOOT.now() + Duration::from_secs(6);
        held(shared).insert(
            id,
            Held {
                key: Arc::from(format!("k{id}")),
                owner: Arc::from("owner"),
                ttl: Duration::from_secs(6),
                renew,
                urgent,
                notifier: loss_channel(Backend::Redis).0,
                clock: Arc::new(LeaseClock::new(Clock::BOOT, deadline)),
            },
        );
        if urgent {
            shared.renew_now.store(true, Ordering::Release);
        }
    }

    fn ids(batch: &[(u64, Renewal)]) -> Vec<u64> {
        let mut ids: Vec<u64> = batch.iter().map(|(id, ..)| *id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_round_of_the_urgent_locks_never_puts_the_full_round_off() {
        let now = Instant::now();
        let wait = Duration::from_millis(100);
        let soon = now + Duration::from_millis(10);
        let later = now + Duration::from_secs(10);
        // A tick after the round's start, already past: a round that took longer.
        let tick = now - Duration::from_millis(5);
        let mut failures = 0;
        // Unconfirmed: retried after a pause, but a full round due sooner stays due.
        assert_eq!(
            after_round(now, soon, true, false, &mut failures, wait, tick),
            soon
        );
        assert_eq!(failures, 1);
        let retry = after_round(now, later, true, false, &mut failures, wait, tick);
        assert!(retry > now && retry < later, "retried soon: {retry:?}");
        // Confirmed: the full round stays where it was, and so does the run of failures.
        assert_eq!(
            after_round(now, soon, true, true, &mut failures, wait, tick),
            soon
        );
        assert_eq!(failures, 2);
        // A full round: retried after a pause, or (confirmed) the failures end.
        let retry = after_round(now, now, false, false, &mut failures, wait, tick);
        assert!(retry > now, "not at once again: {retry:?}");
        assert_eq!(failures, 3);
        // Confirmed: the next a tick after its start, however long it took.
        assert_eq!(
            after_round(now, now, false, true, &mut failures, wait, tick),
            tick
        );
        assert_eq!(failures, 0);
    }

    #[tokio::test]
    async fn a_late_lock_gets_a_round_of_the_urgent_locks_alone_at_once() {
        let shared = shared();
        hold(&shared, 1, true, false);
        hold(&shared, 2, false, false);
        let planned = plan(&shared, Instant::now() + FAR);
        assert!(!planned.urgent_only, "nothing urgent yet");
        hold(&shared, 3, true, true);
        hold(&shared, 4, false, true);
        let full = Instant::now() + Duration::from_secs(1);
        let planned = plan(&shared, full);
        assert!(planned.urgent_only);
        assert!(planned.tick <= Instant::now(), "at once");
        assert_eq!(planned.full, full, "the full round stays where it was");
        // Planned again before the tick (another registration woke the task): still at
        // once, until a round's snapshot takes it.
        assert!(plan(&shared, full).urgent_only);
        assert_eq!(ids(&snapshot(&shared, true)), [3, 4]);
        assert!(!plan(&shared, full).urgent_only, "taken by the snapshot");
        // A full round has the renewing and the urgent locks, not a lock without renewal
        // that is not urgent.
        assert_eq!(ids(&snapshot(&shared, false)), [1, 3, 4]);
    }

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
