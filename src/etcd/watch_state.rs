//! What the client's watches of lock prefixes know, without any I/O: who follows each lock
//! (waiters, and the keys of acquisitions and holders), since which revision every deletion
//! reaches them, and what must be asked of etcd next. `watch_hub.rs` carries the actions
//! out and feeds the responses in; keeping the rules here makes them testable exactly.
//!
//! The rules:
//!
//! - **Coverage.** A follower registered now sees every deletion with a revision above
//!   `max(covered, last dispatched)`: `covered` is where the watch started (the `created`
//!   answer's revision for a watch from "now"; `start - 1` for a watch from a given
//!   revision), and deletions already dispatched went to the followers registered then.
//!   Taking only `covered` loses the deletions dispatched between the watch's creation and
//!   the registration: a waiter that trusted an older read then waits for a key that is
//!   long gone (the contended benchmark deadlocked on exactly that).
//! - **Whole revisions.** etcd sends every event of one revision in one response (a
//!   prefix delete, a revoked lease: `mvcc/watchable_store.go` `notify`, `eventBatch`),
//!   so deletions are dispatched grouped by revision, and a waiter decides on a revision
//!   only after all of it.
//! - **Continuity.** When the stream breaks the watch is opened again from the revision
//!   after the last one it covered: followers see nothing but a delay. When that revision
//!   is compacted (or the server refuses the watch), continuity is lost: waiters are told
//!   to read again, and the keys followed are checked by a read.
//! - **Keys.** A key followed through an acquisition (a [`KeyEntry`]) is lost when a
//!   deletion of its name comes after its create revision, or when a read after a gap
//!   finds it missing or carrying another create revision.
//! - **Short holds cost nothing.** A grant on a lock with no watch does not open one at
//!   once: the watch is asked for [`DEFER`] later if the grant still holds, from the
//!   revision after the grant, so every deletion since is still delivered (a loss is told
//!   at most `DEFER` plus one delivery after it). A lock taken and released within `DEFER`
//!   (most locks) costs the server no watch and no event: on the machines measured, one
//!   watch event per release cost etcd a third more CPU per lock cycle.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, mpsc};
use tokio::time::{Duration, Instant};

use super::small_map::SmallMap;
use super::watch_timers::Timers;

/// A lock prefix or key as the tables keep it: shared with the acquisition that follows it
/// (one client may follow 100,000 keys; a copy per table is a heap block each).
pub(crate) type Name = Arc<[u8]>;

/// How long a lock watch stays open after its last follower left: successive waits and
/// grants on one lock (a busy queue) find it open and synced.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// How long a grant holds before the lock's watch is opened for it (when none is open);
/// see the module docs.
pub(crate) const DEFER: Duration = Duration::from_millis(100);

/// What a waiter hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Every deletion after this revision reaches the waiter from now on.
    Covered(i64),
    /// These keys under the lock's prefix were deleted at this revision: all of that
    /// revision's deletions.
    Deleted(i64, Vec<Vec<u8>>),
    /// Continuity is lost: the waiter must read its place again and follow anew.
    Ended(EndReason),
}

/// Why a watch stopped serving its waiters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndReason {
    /// The revision to resume from was compacted, or the watch broke and could not be
    /// resumed: read again, then follow a new watch.
    Gap(String),
    /// The server refuses to watch the prefix (permission denied): retrying will not help.
    Refused(String),
    /// The client's watch task has stopped (a panic, an abort): no watch of this client
    /// will serve a wait again.
    Stopped,
}

/// What the I/O side must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Create watch `id` over `prefix`, deletions only, from `start` (0: from now).
    Open {
        prefix: Vec<u8>,
        id: i64,
        start: i64,
    },
    /// Cancel watch `id`.
    Cancel { id: i64 },
    /// Read the live keys under `prefix` and report them with [`HubState::verified`]: the
    /// keys followed there may have been deleted while nothing watched.
    Verify { prefix: Vec<u8> },
    /// Work out when to wake again: a deferred watch is due sooner than planned.
    Wake,
}

/// The loss flag of one followed key, shared with its acquisition and then its guard.
///
/// A key can be known gone before it is known *why*: a revoked lease deletes its keys,
/// and the deletion may reach the watch before the keep-alive hears of the revocation.
/// So a loss is marked at once (`is_lost`), and decided (`wait` resolves) once the
/// guard's lease has been checked; see [`OnLost`].
#[derive(Debug, Default)]
pub(crate) struct KeyLoss {
    lost: AtomicBool,
    decided: AtomicBool,
    notify: Notify,
}

impl KeyLoss {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the key lost; returns whether this call did.
    fn mark(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    /// The loss is decided to be the key's own (its lease lives, or nobody could tell).
    pub(crate) fn decide(&self) {
        self.lost.store(true, Ordering::Release);
        if !self.decided.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once the loss is decided to be the key's own.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.decided.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// Called (under the hub's lock: it must only start work) when a held key is found gone,
/// to find out whether its lease went with it and to decide the loss.
pub(crate) type OnLost = Arc<dyn Fn(Arc<KeyLoss>) + Send + Sync>;

/// An [`OnLost`] kept in an entry.
struct Callback(OnLost);

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnLost")
    }
}

/// One acquisition's key, followed from before (or just after) its join until its guard
/// ends.
#[derive(Debug)]
struct KeyEntry {
    id: u64,
    /// The key's create revision, once the join's answer is in.
    token: Option<i64>,
    /// Whether a guard holds the lock on this key, and what to do when it is lost.
    held: bool,
    on_lost: Option<Callback>,
    /// The latest revision at which the key's name was seen deleted or absent (before the
    /// token is known: a deletion after the token means this key went).
    gone_at: i64,
    /// Deletions after this revision reach the entry.
    covered_after: Option<i64>,
    /// The revision up to which the acquisition itself saw its key alive (its join, or a
    /// read of its place); coverage must reach back to it.
    verified_through: i64,
    loss: Arc<KeyLoss>,
}

impl KeyEntry {
    /// Records that the key's name was deleted (or found absent) at `revision`; returns
    /// whether the key is now known lost, and whether that loss is a held lock's.
    fn gone(&mut self, revision: i64) -> Option<bool> {
        self.gone_at = self.gone_at.max(revision);
        self.check()
    }

    /// Whether the key is known lost (marking it): `Some(held)` the first time. A held
    /// key's loss is decided through its callback; any other's at once.
    fn check(&mut self) -> Option<bool> {
        match self.token {
            Some(token) if self.gone_at > token && self.loss.mark() => {
                // A key not held yet is decided when (if) it becomes held, so that the
                // lease is checked and the loss counted then.
                if let (Some(Callback(on_lost)), true) = (&self.on_lost, self.held) {
                    on_lost(self.loss.clone());
                }
                Some(self.held)
            }
            _ => None,
        }
    }

    /// Whether a held key's deletions may have gone unseen: between what its acquisition
    /// saw and where the watch's coverage starts (or while no watch covers it). Keys not
    /// held yet are their acquisition's business: a waiter reads its place again itself.
    fn has_gap(&self, phase: Phase) -> bool {
        if !self.held || self.token.is_none() {
            return false;
        }
        match self.covered_after {
            Some(covered) => covered > self.verified_through,
            // Asked for: decided when it is created.
            None => phase != Phase::Requested && !matches!(phase, Phase::Deferred(_)),
        }
    }
}

/// Where a lock watch stands with the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not asked for yet: only young grants follow it, and it is asked for (from its start
    /// revision) at this time if they still hold then.
    Deferred(Instant),
    /// Asked for; no `created` answer yet.
    Requested,
    /// Created and delivering.
    Open,
    /// Refused by the server or unreachable: asked again after a pause.
    Failing,
}

#[derive(Debug)]
struct LockWatch {
    id: i64,
    /// The revision it was asked to start from (0: from now).
    start: i64,
    phase: Phase,
    /// Every deletion after this revision is or will be dispatched; `None` until known.
    covered: Option<i64>,
    /// The highest revision dispatched.
    last_dispatched: i64,
    waiters: SmallMap<u64, mpsc::UnboundedSender<Signal>>,
    keys: SmallMap<Name, KeyEntry>,
    idle_since: Option<Instant>,
    /// The time of this watch's live entry in [`HubState::timers`], if it has one.
    queued: Option<Instant>,
}

impl LockWatch {
    fn new(id: i64, start: i64, now: Instant) -> Self {
        Self {
            id,
            start,
            phase: Phase::Requested,
            // A watch from a given revision covers what follows it from the start.
            covered: (start > 0).then_some(start - 1),
            last_dispatched: 0,
            waiters: SmallMap::default(),
            keys: SmallMap::default(),
            idle_since: Some(now),
            queued: None,
        }
    }

    /// What a follower registered now is covered from, if known yet.
    fn coverage(&self) -> Option<i64> {
        self.covered.map(|c| c.max(self.last_dispatched))
    }

    fn is_idle(&self) -> bool {
        self.waiters.is_empty() && self.keys.is_empty()
    }

    fn touch(&mut self) {
        self.idle_since = None;
    }

    fn settle(&mut self, now: Instant) {
        if self.is_idle() && self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
    }

    fn is_deferred(&self) -> bool {
        matches!(self.phase, Phase::Deferred(_))
    }

    /// When something is due for this watch: a deferred watch is asked for, an idle one
    /// closed.
    fn due(&self) -> Option<Instant> {
        match self.phase {
            Phase::Deferred(at) => Some(at),
            _ if self.is_idle() => self.idle_since.map(|since| since + LINGER),
            _ => None,
        }
    }
}

/// Everything the hub knows; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct HubState {
    locks: HashMap<Name, LockWatch>,
    by_id: HashMap<i64, Name>,
    /// Watch creations sent and not answered yet, in the order sent. etcd answers them in
    /// the order it reads them, and a refused one (permission denied, a stale auth token)
    /// with id -1, `InvalidWatchID` (`v3rpc/watch.go`, 3.4 and 3.5 alike), so a refusal
    /// is matched to the oldest one sent. Recorded as the task sends ([`Self::sending`]),
    /// not when a watch is asked for: the task sends in its own order (answers handled
    /// before queued actions can ask for and send a watch first), and an id asked for but
    /// superseded before it went out must never be in line.
    pending: VecDeque<i64>,
    next_id: i64,
    next_follower: u64,
    /// Deferred watches to ask for and idle ones to close, and when the task wakes for
    /// them: at most one live entry per watch ([`LockWatch::queued`]); an entry whose
    /// watch changed since is checked again when it comes up.
    timers: Timers,
    /// Watches that failed and wait to be asked again (some may have recovered since).
    failing: HashSet<Name>,
}

/// A key follower's registration: its number (to settle or drop it), and its loss flag.
#[derive(Debug)]
pub(crate) struct Registered {
    pub(crate) follower: u64,
    pub(crate) loss: Arc<KeyLoss>,
}

impl HubState {
    fn new_id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    fn new_follower(&mut self) -> u64 {
        self.next_follower += 1;
        self.next_follower
    }

    /// Whether `id` is still the watch of `prefix` asked for (not superseded since the
    /// request was queued); if so it is recorded as sent: the caller sends it now.
    pub(crate) fn sending(&mut self, prefix: &[u8], id: i64) -> bool {
        let current = self.locks.get(prefix).is_some_and(|w| w.id == id);
        if current {
            self.pending.push_back(id);
        }
        current
    }

    /// The prefix an answer with `watch_id` is about (a creation's: `created`), before it
    /// is handled: a refused creation's id is -1, and it answers the oldest one sent.
    pub(crate) fn answered_prefix(&self, watch_id: i64, created: bool) -> Option<Name> {
        let id = if created && watch_id == -1 {
            *self.pending.front()?
        } else {
            watch_id
        };
        self.by_id.get(&id).cloned()
    }

    /// Whether a watch of `prefix` exists (open or being opened).
    pub(crate) fn is_open(&self, prefix: &[u8]) -> bool {
        self.locks.contains_key(prefix)
    }

    /// The watch of `prefix`, asked for (from `start`, 0: now) if there is none.
    fn watch(
        &mut self,
        prefix: &Name,
        start: i64,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> &mut LockWatch {
        let watch = match self.locks.entry(prefix.clone()) {
            std::collections::hash_map::Entry::Occupied(open) => open.into_mut(),
            std::collections::hash_map::Entry::Vacant(missing) => {
                self.next_id += 1;
                let id = self.next_id;
                self.by_id.insert(id, prefix.clone());
                actions.push(Action::Open {
                    prefix: prefix.to_vec(),
                    id,
                    start,
                });
                missing.insert(LockWatch::new(id, start, now))
            }
        };
        watch.touch();
        watch
    }

    /// Registers a waiter on `prefix` (opening the watch from now if there is none). It
    /// hears [`Signal::Covered`] at once if the coverage is known, else when it is.
    pub(crate) fn subscribe(
        &mut self,
        prefix: &Name,
        signals: mpsc::UnboundedSender<Signal>,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> u64 {
        let follower = self.new_follower();
        if self.locks.get(prefix).is_some_and(LockWatch::is_deferred) {
            // A waiter needs deliveries at once: open the watch now, from now (held keys
            // are checked by a read once it exists).
            self.open_deferred(prefix, 0, actions);
        }
        let watch = self.watch(prefix, 0, now, actions);
        if let Some(coverage) = watch.coverage() {
            let _ = signals.send(Signal::Covered(coverage));
        }
        watch.waiters.insert(follower, signals);
        follower
    }

    /// Removes waiter `follower`.
    pub(crate) fn unsubscribe(
        &mut self,
        prefix: &[u8],
        follower: u64,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        if let Some(watch) = self.locks.get_mut(prefix) {
            watch.waiters.remove(&follower);
            watch.settle(now);
        }
        self.forget_if_unused(prefix);
        self.schedule_waking(prefix, actions);
    }

    /// A deferred watch nobody follows any more is forgotten at once: the server never
    /// knew of it.
    fn forget_if_unused(&mut self, prefix: &[u8]) {
        if self
            .locks
            .get(prefix)
            .is_some_and(|w| w.is_deferred() && w.is_idle())
        {
            self.locks.remove(prefix);
        }
    }

    /// Asks for the deferred watch of `prefix`, from `start` (0: now).
    fn open_deferred(&mut self, prefix: &[u8], start: i64, actions: &mut Vec<Action>) {
        self.next_id += 1;
        let id = self.next_id;
        let Some(name) = self.name(prefix) else {
            return;
        };
        let Some(watch) = self.locks.get_mut(prefix) else {
            return;
        };
        watch.id = id;
        watch.start = start;
        watch.phase = Phase::Requested;
        if start == 0 {
            watch.covered = None;
            for entry in watch.keys.values_mut() {
                entry.covered_after = None;
            }
        }
        self.by_id.insert(id, name);
        actions.push(Action::Open {
            prefix: prefix.to_vec(),
            id,
            start,
        });
    }

    /// The table's own copy of `prefix`, shared by its entries elsewhere.
    fn name(&self, prefix: &[u8]) -> Option<Name> {
        self.locks
            .get_key_value(prefix)
            .map(|(name, _)| name.clone())
    }

    /// Puts `prefix`'s next due time (if any) in the timer queue, unless an entry no
    /// later than it is there already (that entry reschedules when it comes up).
    fn schedule(&mut self, prefix: &[u8]) {
        let Some((name, watch)) = self.locks.get_key_value(prefix) else {
            return;
        };
        let Some(due) = watch.due() else {
            return;
        };
        if watch.queued.is_none_or(|queued| queued > due) {
            let name = name.clone();
            if let Some(watch) = self.locks.get_mut(prefix) {
                watch.queued = Some(due);
            }
            self.timers.push(due, name);
        }
    }

    /// [`schedule`](Self::schedule), and wakes the task if it would sleep past the new
    /// time (it may sleep with no deadline at all): an idle watch is closed on time even
    /// when nothing else happens.
    fn schedule_waking(&mut self, prefix: &[u8], actions: &mut Vec<Action>) {
        self.schedule(prefix);
        let Some(due) = self.locks.get(prefix).and_then(|w| w.queued) else {
            return;
        };
        if self.timers.wake_for(due) {
            actions.push(Action::Wake);
        }
    }

    /// When the task, planning at `now`, wakes next (see [`Timers::plan`]): an entry
    /// stands while its watch is still queued for its time.
    pub(crate) fn next_timer(&mut self, now: Instant) -> Option<Instant> {
        let locks = &self.locks;
        self.timers.plan(now, DEFER, |at, prefix| {
            locks.get(prefix).is_some_and(|w| w.queued == Some(at))
        })
    }

    /// Runs the timers that are due: asks for the deferred watches still followed (from
    /// their start revision: nothing since the grant is missed) and forgets the others;
    /// closes the watches idle for [`LINGER`].
    pub(crate) fn run_timers(&mut self, now: Instant, actions: &mut Vec<Action>) {
        while let Some((at, prefix)) = self.timers.pop_due(now) {
            let Some(watch) = self.locks.get_mut(&prefix) else {
                continue;
            };
            if watch.queued != Some(at) {
                // Another entry of this watch is queued; that one decides.
                continue;
            }
            watch.queued = None;
            match watch.phase {
                Phase::Deferred(due) if due <= now => {
                    if watch.is_idle() {
                        self.locks.remove(&prefix);
                    } else {
                        let start = watch.start;
                        self.open_deferred(&prefix, start, actions);
                    }
                }
                _ if !watch.is_deferred()
                    && watch.is_idle()
                    && watch.idle_since.is_some_and(|s| s + LINGER <= now) =>
                {
                    let id = watch.id;
                    self.locks.remove(&prefix);
                    // Its id stays in `pending` until answered: a refusal comes back as
                    // -1 and must take its own place in line, not the next watch's.
                    self.by_id.remove(&id);
                    actions.push(Action::Cancel { id });
                }
                // Changed since it was queued: queue it again for its new time, if any.
                _ => self.schedule(&prefix),
            }
        }
    }

    /// Follows `key` under `prefix` from now on, before its token is known (the join is
    /// yet to be answered, or a waiter has not read its place yet). The watch must exist
    /// (`open` first, or check [`is_open`](Self::is_open)); `None` otherwise.
    pub(crate) fn track(&mut self, prefix: &[u8], key: &Name) -> Option<Registered> {
        let follower = self.new_follower();
        let watch = self.locks.get_mut(prefix)?;
        watch.touch();
        let loss = Arc::new(KeyLoss::default());
        watch.keys.insert(
            key.clone(),
            KeyEntry {
                id: follower,
                token: None,
                held: false,
                on_lost: None,
                gone_at: 0,
                covered_after: watch.coverage(),
                verified_through: 0,
                loss: loss.clone(),
            },
        );
        Some(Registered { follower, loss })
    }

    /// The join of tracked `key` is answered: its create revision is `token`. Returns
    /// whether the key is already known gone (a deletion of it was seen).
    pub(crate) fn settle_token(
        &mut self,
        prefix: &[u8],
        key: &[u8],
        follower: u64,
        token: i64,
    ) -> bool {
        let Some(entry) = self.entry(prefix, key, follower) else {
            return false;
        };
        entry.token = Some(token);
        entry.check();
        entry.loss.is_lost()
    }

    /// The tracked key's acquisition holds the lock now, having seen its key alive at
    /// `verified_through` (its join, or its last read of its place). Asks for a check by
    /// read if the watch's coverage does not reach back that far. Returns whether the key
    /// is already known gone.
    pub(crate) fn hold_tracked(
        &mut self,
        prefix: &[u8],
        key: &[u8],
        follower: u64,
        verified_through: i64,
        on_lost: Option<OnLost>,
        actions: &mut Vec<Action>,
    ) -> bool {
        let Some(watch) = self.locks.get_mut(prefix) else {
            return false;
        };
        let phase = watch.phase;
        let Some(entry) = watch.keys.get_mut(key).filter(|e| e.id == follower) else {
            return false;
        };
        entry.held = true;
        entry.on_lost = on_lost.map(Callback);
        entry.verified_through = entry.verified_through.max(verified_through);
        if entry.loss.is_lost() {
            // Lost before it was held: decided (and counted) as a held lock's loss.
            match &entry.on_lost {
                Some(Callback(on_lost)) => on_lost(entry.loss.clone()),
                None => entry.loss.decide(),
            }
            return true;
        }
        if entry.has_gap(phase) {
            actions.push(Action::Verify {
                prefix: prefix.to_vec(),
            });
        }
        false
    }

    /// Follows a key granted at once (`token`, its join's revision) that was not tracked
    /// before its join: opens the watch from the revision after the grant if there is none
    /// (so nothing is missed), else checks by read if the watch starts later.
    pub(crate) fn hold(
        &mut self,
        prefix: &Name,
        key: &Name,
        token: i64,
        on_lost: Option<OnLost>,
        now: Instant,
        actions: &mut Vec<Action>,
    ) -> Registered {
        let follower = self.new_follower();
        if !self.locks.contains_key(prefix) {
            let open_at = now + DEFER;
            let mut deferred = LockWatch::new(0, token + 1, now);
            deferred.phase = Phase::Deferred(open_at);
            self.locks.insert(prefix.clone(), deferred);
            self.schedule_waking(prefix, actions);
        }
        let watch = self.watch(prefix, token + 1, now, actions);
        let loss = Arc::new(KeyLoss::default());
        let entry = KeyEntry {
            id: follower,
            token: Some(token),
            held: true,
            on_lost: on_lost.map(Callback),
            gone_at: 0,
            covered_after: watch.coverage(),
            verified_through: token,
            loss: loss.clone(),
        };
        let gap = entry.has_gap(watch.phase);
        watch.keys.insert(key.clone(), entry);
        if gap {
            actions.push(Action::Verify {
                prefix: prefix.to_vec(),
            });
        }
        Registered { follower, loss }
    }

    /// Stops following `key` (its guard ended, or its acquisition gave up).
    pub(crate) fn untrack(
        &mut self,
        prefix: &[u8],
        key: &[u8],
        follower: u64,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        if let Some(watch) = self.locks.get_mut(prefix) {
            if watch.keys.get(key).is_some_and(|e| e.id == follower) {
                watch.keys.remove(key);
            }
            watch.settle(now);
        }
        self.forget_if_unused(prefix);
        self.schedule_waking(prefix, actions);
    }

    fn entry(&mut self, prefix: &[u8], key: &[u8], follower: u64) -> Option<&mut KeyEntry> {
        self.locks
            .get_mut(prefix)?
            .keys
            .get_mut(key)
            .filter(|e| e.id == follower)
    }

    /// Applies one watch response. `deletions` are its delete events as (key, revision),
    /// in order. Returns the number of held locks found lost.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_response(
        &mut self,
        watch_id: i64,
        created: bool,
        canceled: bool,
        compact_revision: i64,
        cancel_reason: &str,
        header_revision: i64,
        deletions: &[(Vec<u8>, i64)],
        actions: &mut Vec<Action>,
    ) -> usize {
        let id = if created {
            // Answers to creates come in the order sent; a refused one carries id -1.
            let answered = if watch_id == -1 {
                self.pending.pop_front()
            } else {
                self.pending.retain(|p| *p != watch_id);
                Some(watch_id)
            };
            match answered {
                Some(id) => id,
                None => return 0,
            }
        } else {
            watch_id
        };
        let Some(prefix) = self.by_id.get(&id).cloned() else {
            return 0;
        };
        let Some(watch) = self.locks.get_mut(&prefix) else {
            return 0;
        };
        if watch.id != id {
            return 0;
        }
        if created && !canceled {
            watch.phase = Phase::Open;
            if watch.covered.is_none() {
                watch.covered = Some(header_revision);
                let coverage = watch.coverage().unwrap_or(header_revision);
                for signals in watch.waiters.values() {
                    let _ = signals.send(Signal::Covered(coverage));
                }
                let mut gap = false;
                for entry in watch.keys.values_mut() {
                    entry.covered_after = Some(coverage);
                    gap |= entry.has_gap(Phase::Open);
                }
                if gap {
                    actions.push(Action::Verify {
                        prefix: prefix.to_vec(),
                    });
                }
            }
        }
        let mut held_lost = 0;
        let mut i = 0;
        while i < deletions.len() {
            let revision = deletions[i].1;
            let mut keys = Vec::new();
            while i < deletions.len() && deletions[i].1 == revision {
                keys.push(deletions[i].0.clone());
                i += 1;
            }
            for key in &keys {
                if let Some(entry) = watch.keys.get_mut(key.as_slice()) {
                    if entry.gone(revision) == Some(true) {
                        held_lost += 1;
                    }
                }
            }
            watch.last_dispatched = watch.last_dispatched.max(revision);
            for signals in watch.waiters.values() {
                let _ = signals.send(Signal::Deleted(revision, keys.clone()));
            }
        }
        if canceled {
            self.ended(&prefix, compact_revision, cancel_reason, actions);
        }
        held_lost
    }

    /// Watch of `prefix` was cancelled by the server.
    fn ended(
        &mut self,
        prefix: &[u8],
        compact_revision: i64,
        reason: &str,
        actions: &mut Vec<Action>,
    ) {
        // Refused for the stream's stale token (and not renewed, or not yet): asked for
        // again after a pause, not at once on the same stream, which would refuse it again
        // at once; never told to waiters as a refusal.
        let stale = compact_revision == 0 && super::watch_token::is_stale_token(reason);
        let refused = compact_revision == 0 && !stale && reason.contains("permission denied");
        let why = if compact_revision != 0 {
            format!("watch start revision compacted (compact revision {compact_revision})")
        } else if reason.is_empty() {
            "watch cancelled by the server".to_owned()
        } else {
            format!("watch cancelled: {reason}")
        };
        let end = if refused {
            EndReason::Refused(why)
        } else {
            EndReason::Gap(why)
        };
        self.lose_continuity(prefix, end, !refused && !stale, actions);
    }

    /// Continuity of `prefix`'s watch is lost: waiters are told to read again, and (when
    /// `reopen`) a watch from now is asked for, whose creation checks the held keys by
    /// read (a read now would miss deletions before the new watch exists). Otherwise the
    /// held keys are checked now, and again each time the watch is asked for anew
    /// ([`retry_failing`](Self::retry_failing)).
    fn lose_continuity(
        &mut self,
        prefix: &[u8],
        end: EndReason,
        reopen: bool,
        actions: &mut Vec<Action>,
    ) {
        let id = self.new_id();
        let Some(name) = self.name(prefix) else {
            return;
        };
        let Some(watch) = self.locks.get_mut(prefix) else {
            return;
        };
        for signals in watch.waiters.values() {
            let _ = signals.send(Signal::Ended(end.clone()));
        }
        watch.waiters.clear();
        self.by_id.remove(&watch.id);
        watch.id = id;
        watch.start = 0;
        watch.covered = None;
        for entry in watch.keys.values_mut() {
            entry.covered_after = None;
        }
        if !reopen && watch.keys.values().any(|e| e.held) {
            actions.push(Action::Verify {
                prefix: prefix.to_vec(),
            });
        }
        if reopen && !watch.keys.is_empty() {
            watch.phase = Phase::Requested;
            self.by_id.insert(id, name);
            actions.push(Action::Open {
                prefix: prefix.to_vec(),
                id,
                start: 0,
            });
        } else if watch.keys.is_empty() {
            // Nobody left to serve: forget it.
            self.locks.remove(prefix);
        } else {
            watch.phase = Phase::Failing;
            self.failing.insert(name);
        }
    }

    /// The watch stream broke: every watch is asked again from the revision after the one
    /// it covered (followers notice only a delay); a watch whose coverage was not known
    /// yet is asked again from where it was asked.
    pub(crate) fn stream_broken(&mut self, actions: &mut Vec<Action>) {
        self.pending.clear();
        let prefixes: Vec<Name> = self
            .locks
            .iter()
            .filter(|(_, w)| !w.is_deferred())
            .map(|(p, _)| p.clone())
            .collect();
        for prefix in prefixes {
            let id = self.new_id();
            let Some(watch) = self.locks.get_mut(&prefix) else {
                continue;
            };
            self.by_id.remove(&watch.id);
            watch.id = id;
            let start = match watch.coverage() {
                Some(coverage) => coverage + 1,
                None => watch.start,
            };
            watch.start = start;
            watch.phase = Phase::Requested;
            self.by_id.insert(id, prefix.clone());
            actions.push(Action::Open {
                prefix: prefix.to_vec(),
                id,
                start,
            });
        }
    }

    /// A watch could not even be asked for (no stream could be opened): its waiters read
    /// again; its keys are checked by read and the watch is asked again later.
    pub(crate) fn open_failed(&mut self, id: i64, why: &str, actions: &mut Vec<Action>) {
        // Never answered, whatever became of its watch.
        self.pending.retain(|p| *p != id);
        let Some(prefix) = self.by_id.get(&id).cloned() else {
            return;
        };
        self.lose_continuity(&prefix, EndReason::Gap(why.to_owned()), false, actions);
    }

    /// Asks again for the watches that failed (called after a pause).
    pub(crate) fn retry_failing(&mut self, actions: &mut Vec<Action>) {
        let failing: Vec<Name> = self.failing.drain().collect();
        for prefix in failing {
            let id = self.new_id();
            if let Some(watch) = self
                .locks
                .get_mut(&prefix)
                .filter(|w| w.phase == Phase::Failing)
            {
                watch.id = id;
                watch.phase = Phase::Requested;
                self.by_id.insert(id, prefix.clone());
                actions.push(Action::Open {
                    prefix: prefix.to_vec(),
                    id,
                    start: 0,
                });
            }
        }
    }

    /// Whether keys held under `prefix` are followed.
    pub(crate) fn holds_keys(&self, prefix: &[u8]) -> bool {
        self.locks
            .get(prefix)
            .is_some_and(|w| w.keys.values().any(|e| e.held))
    }

    /// Whether some watch failed and waits to be asked again.
    pub(crate) fn has_failing(&self) -> bool {
        !self.failing.is_empty()
    }

    /// The live keys under `prefix`, read at `revision` (a read made after the gap it
    /// covers), as (key, create revision). Returns the number of held locks found lost.
    pub(crate) fn verified(
        &mut self,
        prefix: &[u8],
        revision: i64,
        live: &[(Vec<u8>, i64)],
    ) -> usize {
        let Some(watch) = self.locks.get_mut(prefix) else {
            return 0;
        };
        let live: HashMap<&[u8], i64> = live.iter().map(|(k, c)| (k.as_slice(), *c)).collect();
        let mut held_lost = 0;
        for (key, entry) in watch.keys.iter_mut() {
            let lost = match live.get(&**key) {
                // Another key of the same name: ours went before it.
                Some(created) if entry.token.is_some_and(|t| t != *created) => entry.gone(revision),
                Some(_) => None,
                None => entry.gone(revision),
            };
            if lost == Some(true) {
                held_lost += 1;
            }
            entry.verified_through = entry.verified_through.max(revision);
        }
        held_lost
    }

    /// The prefixes with a watch, for tests and inspection.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &[u8] = b"ns/x/";

    fn name(bytes: &[u8]) -> Name {
        Arc::from(bytes)
    }

    fn open_now(state: &mut HubState, now: Instant) -> (u64, mpsc::UnboundedReceiver<Signal>, i64) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        let follower = state.subscribe(&name(P), tx, now, &mut actions);
        let id = match actions.as_slice() {
            [Action::Open { id, start: 0, .. }] => *id,
            other => panic!("{other:?}"),
        };
        assert!(state.sending(P, id), "the task sends it");
        (follower, rx, id)
    }

    /// etcd refuses the oldest creation sent, as 3.4 and 3.5 do: with id -1.
    fn refuse_oldest_sent(state: &mut HubState) {
        let reason = "etcdserver: permission denied";
        state.on_response(-1, true, true, 0, reason, 5, &[], &mut Vec::new());
    }

    fn created(state: &mut HubState, id: i64, revision: i64) {
        state.on_response(id, true, false, 0, "", revision, &[], &mut Vec::new());
    }

    fn deleted(state: &mut HubState, id: i64, keys: &[(&[u8], i64)]) -> usize {
        let deletions: Vec<(Vec<u8>, i64)> = keys.iter().map(|(k, r)| (k.to_vec(), *r)).collect();
        let last = deletions.last().map_or(0, |d| d.1);
        state.on_response(id, false, false, 0, "", last, &deletions, &mut Vec::new())
    }

    #[test]
    fn a_waiter_registered_after_a_dispatch_is_covered_from_that_dispatch() {
        // The deadlock of the contended benchmark: the watch was created at 90, a deletion
        // at 101 was dispatched, then a waiter whose read is at 100 subscribed. It must
        // learn that it is covered only from 101 (and read again), never from 90.
        let now = Instant::now();
        let mut state = HubState::default();
        let (_first, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 90);
        deleted(&mut state, id, &[(b"ns/x/a", 101)]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        state.subscribe(&name(P), tx, now, &mut Vec::new());
        match rx.try_recv() {
            Ok(Signal::Covered(revision)) => assert!(revision >= 101, "covered from {revision}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deletions_of_one_revision_arrive_together() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        assert_eq!(rx.try_recv(), Ok(Signal::Covered(10)));
        deleted(
            &mut state,
            id,
            &[(b"ns/x/a", 11), (b"ns/x/b", 11), (b"ns/x/c", 12)],
        );
        assert_eq!(
            rx.try_recv(),
            Ok(Signal::Deleted(
                11,
                vec![b"ns/x/a".to_vec(), b"ns/x/b".to_vec()]
            ))
        );
        assert_eq!(
            rx.try_recv(),
            Ok(Signal::Deleted(12, vec![b"ns/x/c".to_vec()]))
        );
    }

    #[test]
    fn a_held_key_is_lost_on_a_deletion_after_its_token_only() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        let key = b"ns/x/k-0";
        let mut actions = Vec::new();
        let tracked = state.track(P, &name(key)).expect("watch open");
        // The name's previous key is deleted before the join is answered.
        deleted(&mut state, id, &[(key, 11)]);
        assert!(!state.settle_token(P, key, tracked.follower, 12));
        assert!(!state.hold_tracked(P, key, tracked.follower, 12, None, &mut actions));
        assert!(actions.is_empty(), "{actions:?}");
        assert!(!tracked.loss.is_lost());
        // Our own key is deleted (an operator): the holder is told.
        assert_eq!(deleted(&mut state, id, &[(key, 15)]), 1);
        assert!(tracked.loss.is_lost());
    }

    #[test]
    fn a_deletion_seen_before_the_token_is_known_still_counts_if_it_is_later() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        let key = b"ns/x/k-0";
        let tracked = state.track(P, &name(key)).expect("watch open");
        // Joined at 12 and deleted at 13, before the join's answer arrived.
        deleted(&mut state, id, &[(key, 13)]);
        assert!(state.settle_token(P, key, tracked.follower, 12));
        assert!(tracked.loss.is_lost());
    }

    #[test]
    fn a_grant_without_a_watch_opens_one_from_the_next_revision_once_it_has_held_a_while() {
        let now = Instant::now();
        let mut state = HubState::default();
        let mut actions = Vec::new();
        let held = state.hold(&name(P), &name(b"ns/x/k-0"), 41, None, now, &mut actions);
        assert_eq!(
            actions,
            vec![Action::Wake],
            "nothing asked of the server yet"
        );
        assert_eq!(state.next_timer(now), Some(now + DEFER));
        let mut actions = Vec::new();
        state.run_timers(now + DEFER, &mut actions);
        assert!(
            matches!(actions.as_slice(), [Action::Open { start: 42, .. }]),
            "{actions:?}"
        );
        assert!(!held.loss.is_lost());
        // A waiter that joined at 45 is covered from 41: its join's read is enough.
        let (tx, mut rx) = mpsc::unbounded_channel();
        state.subscribe(&name(P), tx, now, &mut Vec::new());
        assert_eq!(rx.try_recv(), Ok(Signal::Covered(41)));
    }

    #[test]
    fn a_short_hold_never_asks_the_server_for_a_watch() {
        let now = Instant::now();
        let mut state = HubState::default();
        let held = state.hold(&name(P), &name(b"ns/x/k-0"), 41, None, now, &mut Vec::new());
        let mut actions = Vec::new();
        state.untrack(P, b"ns/x/k-0", held.follower, now, &mut actions);
        assert!(
            actions.is_empty(),
            "a forgotten deferral needs no wake: {actions:?}"
        );
        state.run_timers(now + DEFER, &mut actions);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!(state.watched(), 0);
        // The next grant arms a new one; the task is already due to wake, no new wake-up.
        let mut actions = Vec::new();
        state.hold(&name(P), &name(b"ns/x/k-0"), 50, None, now, &mut actions);
        assert!(actions.is_empty(), "{actions:?}");
    }

    #[test]
    fn short_holds_one_after_another_wake_the_task_once_not_once_each() {
        let now = Instant::now();
        let mut state = HubState::default();
        let key = name(b"ns/x/k-0");
        for i in 0..50u32 {
            let at = now + Duration::from_micros(250) * i;
            let mut actions = Vec::new();
            let held = state.hold(&name(P), &key, 41 + i64::from(i), None, at, &mut actions);
            assert_eq!(
                actions.is_empty(),
                i > 0,
                "hold {i}: only the first wakes the task: {actions:?}"
            );
            state.untrack(P, &key, held.follower, at, &mut Vec::new());
            // Were the task to plan after the release (woken, it runs after the caller):
            // the grant's time is still ahead, so it sleeps until then, not with no
            // deadline that the next grant would have to wake it from.
            assert_eq!(state.next_timer(at), Some(at + DEFER), "hold {i}");
        }
        let mut actions = Vec::new();
        state.run_timers(now + DEFER, &mut actions);
        assert!(actions.is_empty(), "every hold was released: {actions:?}");
        assert_eq!(state.watched(), 0);
    }

    #[test]
    fn a_hold_that_outlives_stale_entries_gets_its_watch_on_time() {
        let now = Instant::now();
        let mut state = HubState::default();
        let key = name(b"ns/x/k-0");
        let short = state.hold(&name(P), &key, 41, None, now, &mut Vec::new());
        state.untrack(P, &key, short.follower, now, &mut Vec::new());
        assert_eq!(state.next_timer(now), Some(now + DEFER));
        // Granted again 1 ms later and held: no wake-up, the task wakes before it is due.
        let later = now + Duration::from_millis(1);
        let mut actions = Vec::new();
        let held = state.hold(&name(P), &key, 43, None, later, &mut actions);
        assert!(actions.is_empty(), "{actions:?}");
        state.run_timers(now + DEFER, &mut actions);
        assert!(actions.is_empty(), "not due yet: {actions:?}");
        assert_eq!(state.next_timer(now + DEFER), Some(later + DEFER));
        state.run_timers(later + DEFER, &mut actions);
        assert!(
            matches!(actions.as_slice(), [Action::Open { start: 44, .. }]),
            "{actions:?}"
        );
        assert!(!held.loss.is_lost());
    }

    #[test]
    fn a_waiter_on_a_deferred_watch_opens_it_from_now_and_held_keys_are_checked() {
        let now = Instant::now();
        let mut state = HubState::default();
        state.hold(&name(P), &name(b"ns/x/k-0"), 41, None, now, &mut Vec::new());
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        state.subscribe(&name(P), tx, now, &mut actions);
        let id = match actions.as_slice() {
            [Action::Open { start: 0, id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        let mut actions = Vec::new();
        state.on_response(id, true, false, 0, "", 60, &[], &mut actions);
        assert_eq!(actions, vec![Action::Verify { prefix: P.to_vec() }]);
    }

    #[test]
    fn a_grant_on_a_watch_that_starts_later_is_checked_by_read() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 50);
        let mut actions = Vec::new();
        let held = state.hold(&name(P), &name(b"ns/x/k-0"), 41, None, now, &mut actions);
        assert!(
            matches!(actions.as_slice(), [Action::Verify { .. }]),
            "{actions:?}"
        );
        // The read finds another key under the name: ours is gone.
        assert_eq!(state.verified(P, 52, &[(b"ns/x/k-0".to_vec(), 48)]), 1);
        assert!(held.loss.is_lost());
    }

    #[test]
    fn a_broken_stream_resumes_from_the_revision_after_the_last_covered() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        deleted(&mut state, id, &[(b"ns/x/a", 17)]);
        let mut actions = Vec::new();
        state.stream_broken(&mut actions);
        let new_id = match actions.as_slice() {
            [Action::Open { start: 18, id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        created(&mut state, new_id, 30);
        // The waiter noticed nothing but the deletion.
        assert_eq!(rx.try_recv(), Ok(Signal::Covered(10)));
        assert!(matches!(rx.try_recv(), Ok(Signal::Deleted(17, _))));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_compacted_resume_makes_waiters_read_again_and_checks_keys() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        let tracked = state.track(P, &name(b"ns/x/k")).expect("open");
        state.settle_token(P, b"ns/x/k", tracked.follower, 11);
        state.hold_tracked(P, b"ns/x/k", tracked.follower, 11, None, &mut Vec::new());
        let mut actions = Vec::new();
        state.on_response(id, false, true, 25, "", 30, &[], &mut actions);
        assert!(matches!(rx.try_recv(), Ok(Signal::Covered(10))));
        assert!(matches!(
            rx.try_recv(),
            Ok(Signal::Ended(EndReason::Gap(_)))
        ));
        let reopened = match actions.as_slice() {
            [Action::Open { start: 0, id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        // Once the new watch exists, the held key is checked by read.
        let mut actions = Vec::new();
        state.on_response(reopened, true, false, 0, "", 40, &[], &mut actions);
        assert_eq!(actions, vec![Action::Verify { prefix: P.to_vec() }]);
        assert_eq!(state.verified(P, 41, &[]), 1, "the key is gone");
        assert!(tracked.loss.is_lost());
    }

    #[test]
    fn a_watch_refused_for_a_stale_token_is_asked_for_again_after_a_pause_not_at_once() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        let tracked = state.track(P, &name(b"ns/x/k")).expect("open");
        state.settle_token(P, b"ns/x/k", tracked.follower, 11);
        state.hold_tracked(P, b"ns/x/k", tracked.follower, 11, None, &mut Vec::new());
        let mut actions = Vec::new();
        let reason = "etcdserver: invalid auth token";
        state.on_response(id, false, true, 0, reason, 30, &[], &mut actions);
        assert_eq!(rx.try_recv(), Ok(Signal::Covered(10)));
        // Waiters read again (a gap), never told the lock is refused to them.
        assert!(matches!(
            rx.try_recv(),
            Ok(Signal::Ended(EndReason::Gap(_)))
        ));
        // Not asked for at once on the same stream; the held key is checked by read.
        assert_eq!(actions, vec![Action::Verify { prefix: P.to_vec() }]);
        assert!(state.has_failing());
    }

    #[test]
    fn a_permission_refusal_the_hub_found_stale_is_a_gap_not_a_refusal() {
        // The hub's read found the keys readable but could not renew the token: it
        // hands the refusal on with this reason instead of "permission denied".
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, id) = open_now(&mut state, now);
        let reason = format!(
            "{} (etcdserver: permission denied)",
            super::super::watch_token::STALE_TOKEN
        );
        let mut actions = Vec::new();
        state.on_response(id, true, true, 0, &reason, 30, &[], &mut actions);
        assert!(matches!(
            rx.try_recv(),
            Ok(Signal::Ended(EndReason::Gap(_)))
        ));
        assert!(
            !actions.iter().any(|a| matches!(a, Action::Open { .. })),
            "{actions:?}"
        );
    }

    #[test]
    fn a_refused_watch_answered_with_id_minus_one_is_matched_to_its_request() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (_f, mut rx, _id) = open_now(&mut state, now);
        refuse_oldest_sent(&mut state);
        assert!(matches!(
            rx.try_recv(),
            Ok(Signal::Ended(EndReason::Refused(_)))
        ));
        assert_eq!(state.watched(), 0, "nobody left to serve");
    }

    #[test]
    fn a_refusal_is_matched_to_the_creation_sent_first_not_the_one_asked_for_first() {
        // etcd answers a refused creation with id -1. The task may send a watch asked for
        // later (one it asks for itself while handling answers) before one still queued.
        let now = Instant::now();
        let mut state = HubState::default();
        let (a, b): (&[u8], &[u8]) = (b"ns/a/", b"ns/b/");
        let (tx_a, mut rx_a) = mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        state.subscribe(&name(a), tx_a, now, &mut actions);
        state.subscribe(&name(b), tx_b, now, &mut actions);
        let ids: Vec<i64> = actions
            .iter()
            .map(|action| match action {
                Action::Open { id, .. } => *id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(state.sending(b, ids[1]));
        assert!(state.sending(a, ids[0]));
        refuse_oldest_sent(&mut state);
        assert!(matches!(
            rx_b.try_recv(),
            Ok(Signal::Ended(EndReason::Refused(_)))
        ));
        assert!(rx_a.try_recv().is_err(), "a's watch was not refused");
        created(&mut state, ids[0], 6);
        assert_eq!(rx_a.try_recv(), Ok(Signal::Covered(6)));
    }

    #[test]
    fn a_creation_superseded_before_it_was_sent_is_never_in_line_for_a_refusal() {
        // A watch asked for and closed (idle) before the task sent it, then asked for
        // again: only the second request goes out, and a refusal is its.
        let now = Instant::now();
        let mut state = HubState::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        let first = state.subscribe(&name(P), tx, now, &mut actions);
        let unsent = match actions.as_slice() {
            [Action::Open { id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        state.unsubscribe(P, first, now, &mut Vec::new());
        let mut actions = Vec::new();
        state.run_timers(now + LINGER, &mut actions);
        assert_eq!(actions, vec![Action::Cancel { id: unsent }]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        state.subscribe(&name(P), tx, now + LINGER, &mut actions);
        let again = match actions.as_slice() {
            [Action::Open { id, .. }] => *id,
            other => panic!("{other:?}"),
        };
        assert!(!state.sending(P, unsent), "superseded: skipped by the task");
        assert!(state.sending(P, again));
        refuse_oldest_sent(&mut state);
        assert!(matches!(
            rx.try_recv(),
            Ok(Signal::Ended(EndReason::Refused(_)))
        ));
    }

    #[test]
    fn idle_watches_close_after_the_linger() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (follower, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        let mut actions = Vec::new();
        state.unsubscribe(P, follower, now, &mut actions);
        // The task may sleep with no deadline: it is woken to plan the close.
        assert_eq!(actions, vec![Action::Wake]);
        assert_eq!(state.next_timer(now), Some(now + LINGER));
        actions.clear();
        state.run_timers(now + LINGER / 2, &mut actions);
        assert!(actions.is_empty());
        state.run_timers(now + LINGER, &mut actions);
        assert_eq!(actions, vec![Action::Cancel { id }]);
        assert_eq!(state.watched(), 0);
    }

    #[test]
    fn a_watch_used_again_closes_linger_after_its_last_use_not_its_first() {
        let now = Instant::now();
        let mut state = HubState::default();
        let (follower, _rx, id) = open_now(&mut state, now);
        created(&mut state, id, 10);
        state.unsubscribe(P, follower, now, &mut Vec::new());
        // Used again before it was due to close, and left again a second later.
        let (tx, _rx2) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        let later = now + Duration::from_secs(1);
        let again = state.subscribe(&name(P), tx, later, &mut actions);
        assert!(actions.is_empty(), "the open watch serves: {actions:?}");
        state.unsubscribe(P, again, later, &mut Vec::new());
        state.run_timers(now + LINGER, &mut actions);
        assert!(actions.is_empty(), "closed too early: {actions:?}");
        assert_eq!(state.next_timer(now + LINGER), Some(later + LINGER));
        state.run_timers(later + LINGER, &mut actions);
        assert_eq!(actions, vec![Action::Cancel { id }]);
        assert_eq!(state.watched(), 0);
        assert_eq!(
            state.next_timer(later + LINGER),
            None,
            "nothing left queued"
        );
    }
}
