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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use super::id_map::IdMap;
use super::node::Node;
use super::node_renewal::{NodeRenewal, Renewing, RoundProgress};
use super::round_tally::{RoundTally, Verdict};
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
    held: Mutex<IdMap<Held>>,
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
    /// Set (under the map's lock) once the task has stopped, however it ended (a panic
    /// in it, the runtime shutting down): every lock in the map was reported lost, and
    /// the next registration starts a new task (under the same lock).
    stopped: AtomicBool,
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
            stopped: AtomicBool::new(false),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Handle to the renewal task; the task stops when the handle is dropped.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    /// Stops the task when dropped; replaced when a new task is started.
    stop: Mutex<oneshot::Sender<()>>,
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
        let stop = Mutex::new(spawn_task(&shared));
        Self { shared, stop }
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
        // urgent locks alone, at once (a round in flight stops sending, ends when its
        // calls in flight are answered, and the next starts at once);
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
        let (wake, restart) = {
            // Under the map's lock, so that the task's plan and this check cannot cross.
            let mut held = held(&self.shared);
            // The task died (its locks were reported lost): this lock gets a new one,
            // started below, rather than a client that grants locks nobody renews.
            // Cleared under the map's lock, as it is set: one restart per death.
            let restart = self.shared.stopped.load(Ordering::Acquire);
            if restart {
                self.shared.stopped.store(false, Ordering::Release);
                self.shared.planned_wake.store(u64::MAX, Ordering::Release);
            }
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
            let wake = needs < self.shared.planned_wake.fetch_min(needs, Ordering::AcqRel);
            (wake, restart)
        };
        if restart {
            // Not under the map's lock: a runtime shutting down drops the new task at
            // once, inside `spawn`, and its report takes that lock (it then reports this
            // lock lost). Under the stop handle's lock, so that restarts store their
            // handles in order (only the new task's report can ask for the next one).
            // The new task's first plan reads the map, this lock in it.
            let mut stop = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
            *stop = spawn_task(&self.shared);
            // After the spawn: nothing between clearing `stopped` and it may panic (a
            // tracing layer that does), or no task would be left to restart.
            tracing::warn!("the Redis renewal task had stopped; a new one was started");
        } else if wake {
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

fn held(shared: &Shared) -> MutexGuard<'_, IdMap<Held>> {
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

/// Reports every lock the task leaves behind as lost when its future is dropped,
/// however it ends: a panic in it (a bug, or a metrics recorder that panics while a
/// renewal is counted), an abort, the runtime shutting down, a runtime gone before the
/// task was first polled. A dead task renews nothing and marks nothing expired: without
/// this, its locks' guards would wait on a loss nobody reports while their keys expire
/// on the servers. Locks without renewal are reported too (before their TTL ends: on the
/// safe side), and so is a lock registered while the task ends.
struct ReportOnStop(Arc<Shared>);

impl Drop for ReportOnStop {
    fn drop(&mut self) {
        let orphans = {
            let mut held = held(&self.0);
            self.0.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *held)
        };
        if !orphans.is_empty() {
            // A panic in it, an abort, or its runtime shut down with locks still held: no
            // telling which here (tokio drops a task's future after it has caught the
            // task's panic, so no unwind is seen in this drop).
            tracing::warn!(
                locks = orphans.len(),
                "the Redis renewal task stopped; its locks are reported lost"
            );
        }
        // `mark` catches a panicking recorder: no second panic during an unwind.
        for (_, lock) in orphans {
            lock.notifier.mark(LossReason::Unrenewed);
        }
    }
}

/// Spawns the task on the caller's runtime; returns what stops it when dropped. A
/// restarted task runs on the runtime of the lock call that restarted it.
fn spawn_task(shared: &Arc<Shared>) -> oneshot::Sender<()> {
    let (stop_tx, stop_rx) = oneshot::channel();
    // The report is made here and moved in, not made by the task: a task dropped before
    // it was first polled (its runtime shut down at once) reports, and is replaced, too.
    let report = ReportOnStop(shared.clone());
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(run(shared.clone(), stop_rx, report))),
        // No runtime to run it on: what it would keep is reported lost now (the report
        // dropped here), and the next registration tries again.
        Err(_) => drop(report),
    }
    stop_tx
}

/// The task: renews, and marks the expired lost, until `stop` fires or it is dropped
/// (`report` then does what is left).
async fn run(shared: Arc<Shared>, mut stop: oneshot::Receiver<()>, _report: ReportOnStop) {
    // The next full round: ticks follow from the last one; `plan` only brings them forward.
    let mut next_tick = Instant::now() + FAR;
    // Failed or unanswered renewal attempts in a row.
    let mut failures = 0u32;
    // The rounds whose slower nodes still get the rest in the background: stopped (no
    // more calls sent) when the next full round starts, and when the task ends.
    let mut draining: Vec<RoundStop> = Vec::new();
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
                if planned.urgent_only {
                    // Those whose background rest has ended.
                    draining.retain(RoundStop::in_use);
                } else {
                    draining.clear();
                }
                let round_stop = RoundStop::default();
                // Taken here, before the plan below reads the renew-now flag it clears:
                // the late locks it was set for are in this round.
                let batch = snapshot(&shared, planned.urgent_only);
                let renewal = renew_all(&shared, batch, wait, round_stop.progress());
                tokio::pin!(renewal);
                let end = loop {
                    // Stopped once the next round is due (a tick on from this one's start,
                    // or at once for a lock registered late): a long round (a slow server
                    // or link, many locks) ends with its calls in flight, and the next
                    // starts with the locks whose deadlines come first, so that a lock
                    // taken meanwhile, or one with a shorter TTL, waits for no more than
                    // a window of calls.
                    // A round of the urgent locks alone also stops when the full round is
                    // due: it must not put the full round off.
                    let due_at_most = if planned.urgent_only { planned.full } else { started + FAR };
                    let (earliest, due) = plan_during_renewal(&shared, started, due_at_most);
                    tokio::select! {
                        biased;
                        _ = &mut stop => return,
                        end = &mut renewal => break end,
                        () = shared.changed.notified() => {}
                        () = tokio::time::sleep_until(earliest) => expire_due(&shared),
                        () = tokio::time::sleep_until(due), if !round_stop.is_set() => {
                            round_stop.set();
                        }
                    }
                };
                expire_due(&shared);
                draining.push(round_stop);
                // A tick of the locks held now: one taken during the round with a shorter
                // TTL is due sooner than the round's own tick said.
                let tick = tick.min(tick_interval(&held(&shared)));
                next_tick = after_round(
                    Instant::now(),
                    next_tick,
                    planned.urgent_only,
                    end,
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
/// confirmed is retried soon (as a full round), not a tick later. A full round stopped
/// before all its calls were sent (the next round was due), by which a quorum of nodes
/// answered all they were sent, goes on at once, as no failure; an urgent one stopped
/// so leaves the full round where it was (stopped by a new late lock, that lock gets a
/// round of the urgent locks next, `plan`; stopped by the tick or the full round's time,
/// the full round goes at once, its unsent locks first). A round of the urgent locks
/// alone leaves the full round where it was, or brings it forward: for the retry, or to
/// a tick after its start with the tick of the locks held at its end (one taken during
/// it with a shorter TTL is due then); never later (the locks it did not have are due
/// then). Only a confirmed full round ends a run of failures.
///
/// A confirmed full round is followed by the next a tick after its start, not after its
/// end (at once if it took longer): a lock renewed in its first calls is due a tick after
/// they were sent, and a long round (many locks, a busy server) would otherwise renew it
/// again a tick after its last, too late for a TTL of three ticks.
#[allow(clippy::too_many_arguments)]
fn after_round(
    now: Instant,
    next_full: Instant,
    urgent_only: bool,
    end: RoundEnd,
    failures: &mut u32,
    wait: Duration,
    a_tick_on: Instant,
) -> Instant {
    // A round of the urgent locks alone never puts the full round later than a tick
    // after its own start, with the tick of the locks held at its end: one taken during
    // it with a shorter TTL is due then.
    let next_full = if urgent_only {
        next_full.min(a_tick_on)
    } else {
        next_full
    };
    if end == RoundEnd::Stopped {
        return if urgent_only {
            next_full
        } else {
            next_full.min(now)
        };
    }
    if end == RoundEnd::Unconfirmed {
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

/// How a round ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RoundEnd {
    /// Every lock of it renewed or found no longer ours.
    Confirmed,
    /// Stopped before all its calls were sent, the next round being due, once a quorum of
    /// nodes answered all they were sent (another may have failed): the locks it did not
    /// send go first in the next.
    Stopped,
    /// Some locks left unconfirmed: a node failed, or too few answered in time.
    Unconfirmed,
}

/// Stops a round: no more of its calls are sent once set (those in flight are still
/// answered). Set when dropped: a round's background rest ends with the next full round,
/// or with the task.
#[derive(Debug, Default)]
struct RoundStop(Arc<RoundProgress>);

impl RoundStop {
    fn set(&self) {
        self.0.stop.store(true, Ordering::Release);
    }

    fn is_set(&self) -> bool {
        self.0.stop.load(Ordering::Acquire)
    }

    /// What the round's calls share.
    fn progress(&self) -> Arc<RoundProgress> {
        self.0.clone()
    }

    /// Whether the round's calls still run (in the background, for the slower nodes).
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

impl Drop for RoundStop {
    fn drop(&mut self) {
        self.set();
    }
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

/// While a round started at `started` is in flight: (when to check the deadlines next,
/// when the next round is due and this one must stop sending), published so that a lock
/// registered meanwhile that needs either sooner wakes the task. The next round is due a
/// tick after this one's start, with the tick of every lock held now (one taken meanwhile
/// with a shorter TTL brings it forward), or at once for a lock registered late, and no
/// later than `at_most`.
fn plan_during_renewal(shared: &Shared, started: Instant, at_most: Instant) -> (Instant, Instant) {
    let held = held(shared);
    let (tick, earliest) = schedule(&held);
    let due = if shared.renew_now.load(Ordering::Acquire) {
        Instant::now()
    } else {
        (started + tick).min(at_most)
    };
    shared
        .planned_wake
        .store(shared.nanos(earliest.min(due)), Ordering::Release);
    (earliest, due)
}

/// The interval of full rounds: a third of the shortest TTL of the renewing locks.
fn tick_interval(held: &IdMap<Held>) -> Duration {
    held.values()
        .filter(|h| h.renew)
        .map(|h| (h.ttl / 3).max(MIN_INTERVAL))
        .min()
        .unwrap_or(FAR)
}

/// (tick interval, when to check the deadlines next) over the tracked locks. Deadlines
/// are on the suspend-aware clock, timers are not: with locks held, look at least every
/// [`RECHECK`].
fn schedule(held: &IdMap<Held>) -> (Duration, Instant) {
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

/// One renewal attempt of the round's `batch` of locks (`snapshot`); a node is given up
/// once it leaves the attempt `wait` without an answer, and no more calls are sent once
/// the round's stop is set (the next round is due). Each lock is decided as soon as its
/// answers do (`round_tally.rs`). The nodes not needed for the decision (Redlock) get
/// the rest of the round in the background, until the stop is set (the next full round).
///
/// The locks go out soonest deadline first: a round stopped or failed partway leaves out
/// the locks renewed most lately, and the next starts with those it left.
async fn renew_all(
    shared: &Arc<Shared>,
    batch: Vec<(u64, Renewal)>,
    wait: Duration,
    progress: Arc<RoundProgress>,
) -> RoundEnd {
    if batch.is_empty() {
        return RoundEnd::Confirmed;
    }
    let round = Arc::new(Round {
        tally: RoundTally::new(batch.len(), shared.quorum, shared.nodes.len()),
        batch,
    });
    let mut pending: FuturesUnordered<_> = shared
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let span =
                tracing::debug_span!("renew", node = %node.address, locks = round.batch.len());
            let (node, round, progress) = (node.clone(), round.clone(), progress.clone());
            let shared = shared.clone();
            let ahead = Duration::from_nanos(shared.ahead[i].load(Ordering::Acquire));
            async move {
                let items: Vec<Renewing<'_>> = round
                    .batch
                    .iter()
                    .map(|(_, (key, owner, ttl))| (&**key, &**owner, *ttl))
                    .collect();
                let answered =
                    |first, answers: &[bool], sent| round.apply(&shared, first, answers, sent);
                (
                    i,
                    node.renew(&items, wait, ahead, &progress, answered).await,
                )
            }
            .instrument(span)
        })
        .collect();
    // Decided as soon as every lock is: a master that stops answering must not hold up
    // the others' answers (Redlock, issue 21). A round stopped partway is over once a
    // quorum of nodes has answered all it sent them, without failing: the locks it did
    // not send, or sent to too few nodes, go first in the next round.
    let (mut finished, mut failed) = (0, 0);
    while let Some((i, reply)) = pending.next().await {
        noted(&shared.ahead, i, &reply);
        if reply.failure.is_some() {
            failed += 1;
        } else {
            finished += 1;
        }
        let stopped = progress.stop.load(Ordering::Acquire) && finished >= shared.quorum;
        if round.tally.undecided() == 0 || stopped {
            break;
        }
    }
    // Counted once per round, not per lock: a client holding 100,000 locks makes two
    // counter updates a tick. The locks a stopped round never sent are not failures.
    let renewed = round.tally.renewed();
    let sent = progress.sent.load(Ordering::Acquire);
    crate::metrics::renewals(shared.backend, renewed, sent.saturating_sub(renewed));
    let end = if round.tally.undecided() == 0 {
        RoundEnd::Confirmed
    } else if progress.stop.load(Ordering::Acquire) && finished >= shared.quorum {
        RoundEnd::Stopped
    } else {
        tracing::debug!(failed, "renewal round left locks unconfirmed");
        RoundEnd::Unconfirmed
    };
    // The other masters still get the rest of the round, in the background until the
    // next full round. A master sent only part of it would let its copies of the rest
    // expire, and from then on one master's fault (a restart without persistence, a
    // clock jump) would cost those locks a quorum, or let another client take them.
    // Their answers still count (a lock a stopped round left undecided may be settled
    // by them).
    if !pending.is_empty() {
        let ahead = shared.ahead.clone();
        tokio::spawn(async move {
            while let Some((i, reply)) = pending.next().await {
                noted(&ahead, i, &reply);
            }
        });
    }
    end
}

/// One round: its locks, and their answers so far.
struct Round {
    batch: Vec<(u64, Renewal)>,
    tally: RoundTally,
}

impl Round {
    /// Counts one node's `answers` for the locks from `first` on, given by a call sent at
    /// `sent`, and applies what they decide: a lock renewed by a quorum has its deadline
    /// moved on (from the earliest of their calls' sending), one that enough nodes say
    /// is no longer ours is reported lost.
    fn apply(&self, shared: &Shared, first: usize, answers: &[bool], sent: ClockInstant) {
        let decided = self.tally.record(first, answers, sent);
        if decided.is_empty() {
            return;
        }
        let mut held = held(shared);
        for (i, verdict) in decided {
            let Some((id, (_, _, ttl))) = self.batch.get(i) else {
                continue;
            };
            let Some(lock) = held.get_mut(id) else {
                continue;
            };
            match verdict {
                Verdict::Renewed { since } => {
                    lock.urgent = false;
                    let validity = ttl.saturating_sub(drift(*ttl, shared.drift_factor));
                    lock.clock.extend_to(since + validity);
                }
                Verdict::NotOurs => {
                    tracing::warn!(key = %lock.key, "lock no longer ours at renewal");
                    lock.notifier.mark(LossReason::Revoked);
                    held.remove(id);
                }
            }
        }
    }
}

/// A duration in nanoseconds, saturating.
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

/// Whether a round renews `lock`: every renewing and every urgent lock, or the urgent ones
/// alone.
fn in_round(lock: &Held, urgent_only: bool) -> bool {
    lock.urgent || (lock.renew && !urgent_only)
}

/// The shortest renewal interval of the locks a round renews: what its answers may be
/// waited for, its time bounded by, and its retry paced by.
fn round_interval(held: &IdMap<Held>, urgent_only: bool) -> Duration {
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

    /// A lock registered after the task died starts a new one. If the runtime is
    /// shutting down, `spawn` drops the new task at once, inside the call, and its report
    /// takes the map's lock: the restart must not hold it then (it did, and the lock
    /// call hung for ever on its own thread, keeping the runtime from shutting down).
    #[test]
    fn a_restart_while_the_runtime_shuts_down_reports_the_lock_and_returns() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let handle = runtime.handle().clone();
        drop(runtime);
        let renewer = Renewer {
            shared: Arc::new(shared()),
            stop: Mutex::new(oneshot::channel().0),
        };
        renewer.shared.stopped.store(true, Ordering::Release);
        let (done, returned) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _entered = handle.enter();
            let registration = renewer.register(
                Arc::from("key"),
                Arc::from("owner"),
                Duration::from_secs(6),
                true,
                Clock::BOOT.now(),
            );
            let _ = done.send((registration.loss.current(), renewer));
        });
        let (seen, renewer) = returned
            .recv_timeout(Duration::from_secs(10))
            .expect("the registration returned");
        assert_eq!(seen, Some(LossReason::Unrenewed));
        // The dropped task's report asks for another restart: the next lock tries again
        // (here with no runtime at all: reported lost at once, nothing spawned).
        assert!(renewer.shared.stopped.load(Ordering::Acquire));
        assert_eq!(renewer.len(), 0);
        let next = renewer.register(
            Arc::from("key"),
            Arc::from("owner"),
            Duration::from_secs(6),
            true,
            Clock::BOOT.now(),
        );
        assert_eq!(next.loss.current(), Some(LossReason::Unrenewed));
        assert!(renewer.shared.stopped.load(Ordering::Acquire));
        assert_eq!(renewer.len(), 0);
    }

    fn hold(shared: &Shared, id: u64, renew: bool, urgent: bool) {
        hold_for(shared, id, renew, urgent, Duration::from_secs(6));
    }

    /// A lock whose deadline is `left` from now.
    fn hold_for(shared: &Shared, id: u64, renew: bool, urgent: bool, left: Duration) {
        let deadline = Clock::BOOT.now() + left;
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

    #[test]
    fn a_round_sends_the_soonest_deadlines_first() {
        let shared = shared();
        for (id, secs) in [(1, 9), (2, 3), (3, 6), (4, 1)] {
            hold_for(&shared, id, true, false, Duration::from_secs(secs));
        }
        let order: Vec<u64> = snapshot(&shared, false).iter().map(|(id, _)| *id).collect();
        assert_eq!(order, [4, 2, 3, 1]);
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
        // A tick after an urgent round's start, later than the full round.
        let no_sooner = later + Duration::from_secs(1);
        let mut failures = 0;
        // Unconfirmed: retried after a pause, but a full round due sooner stays due.
        assert_eq!(
            after_round(
                now,
                soon,
                true,
                RoundEnd::Unconfirmed,
                &mut failures,
                wait,
                no_sooner
            ),
            soon
        );
        assert_eq!(failures, 1);
        let retry = after_round(
            now,
            later,
            true,
            RoundEnd::Unconfirmed,
            &mut failures,
            wait,
            no_sooner,
        );
        assert!(retry > now && retry < later, "retried soon: {retry:?}");
        // Confirmed: the full round stays where it was, and so does the run of failures.
        assert_eq!(
            after_round(
                now,
                soon,
                true,
                RoundEnd::Confirmed,
                &mut failures,
                wait,
                no_sooner
            ),
            soon
        );
        assert_eq!(failures, 2);
        // Unless a lock taken during it (a shorter TTL) is due a tick after its start.
        assert_eq!(
            after_round(
                now,
                later,
                true,
                RoundEnd::Confirmed,
                &mut failures,
                wait,
                tick
            ),
            tick
        );
        // A full round: retried after a pause, or (confirmed) the failures end.
        let retry = after_round(
            now,
            now,
            false,
            RoundEnd::Unconfirmed,
            &mut failures,
            wait,
            tick,
        );
        assert!(retry > now, "not at once again: {retry:?}");
        assert_eq!(failures, 3);
        // Confirmed: the next a tick after its start, however long it took.
        assert_eq!(
            after_round(
                now,
                now,
                false,
                RoundEnd::Confirmed,
                &mut failures,
                wait,
                tick
            ),
            tick
        );
        assert_eq!(failures, 0);
        // A full round stopped (the next round was due): on at once, no failure counted.
        assert_eq!(
            after_round(
                now,
                later,
                false,
                RoundEnd::Stopped,
                &mut failures,
                wait,
                tick
            ),
            now
        );
        // An urgent one: the full round stays where it was, or comes a tick after the
        // round's start if that is sooner (here past: stopped by the tick).
        assert_eq!(
            after_round(
                now,
                later,
                true,
                RoundEnd::Stopped,
                &mut failures,
                wait,
                later + Duration::from_secs(1)
            ),
            later
        );
        assert_eq!(
            after_round(
                now,
                later,
                true,
                RoundEnd::Stopped,
                &mut failures,
                wait,
                tick
            ),
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
