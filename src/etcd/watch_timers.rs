//! When the client's watch task wakes next: the queue of times at which a watch has
//! something due (a deferred watch to ask for, an idle one to close), and the time the
//! task plans to wake, which tells whether a new due time needs the task woken at all.
//!
//! Entries are never removed when their watch changes: a watch forgotten or queued again
//! leaves a stale entry behind, which the owner (`watch_state.rs`) recognises when it
//! comes up. What this module decides is how the task sleeps around stale entries: one
//! short hold after another (each deferred, then forgotten at its release, most locks)
//! leaves one stale entry per hold, and neither waking for each of them nor sleeping with
//! no deadline once they are all stale may cost a turn of the task per lock cycle.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokio::time::{Duration, Instant};

use super::watch_state::Name;

/// The due times of the watches, earliest first, and the task's planned wake-up.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// At most one live entry per watch (the watch records its time); any number of stale
    /// ones. A heap, not a scan: one client may follow 100,000 locks, and the task
    /// consults this on every turn.
    queue: BinaryHeap<Reverse<(Instant, Name)>>,
    /// When the task means to wake next; `None` if it sleeps with no deadline.
    planned: Option<Instant>,
}

impl Timers {
    /// Queues `name` to come up at `at`.
    pub(crate) fn push(&mut self, at: Instant, name: Name) {
        self.queue.push(Reverse((at, name)));
    }

    /// Whether the task must be woken for something due at `at`: it means to sleep past
    /// it, or with no deadline. If so, `at` becomes the planned wake-up (the task, once
    /// woken, plans again with [`plan`](Self::plan)).
    pub(crate) fn wake_for(&mut self, at: Instant) -> bool {
        if self.planned.is_none_or(|planned| planned > at) {
            self.planned = Some(at);
            true
        } else {
            false
        }
    }

    /// Takes the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Name)> {
        match self.queue.peek() {
            Some(Reverse((at, _))) if *at <= now => {
                self.queue.pop().map(|Reverse((at, name))| (at, name))
            }
            _ => None,
        }
    }

    /// When the task wakes next, planned at `now`. `is_live` says whether an entry still
    /// stands; `soonest` is the least time after its queuing at which any entry is due
    /// (`DEFER`). Stale entries before the earliest live one are dropped. If one of them
    /// was later than `now` (a short hold, released since: more are likely to follow),
    /// the task wakes at `now + soonest` if that comes before the earliest live entry:
    /// whatever is queued from now on is due no sooner, so it needs no wake-up of its own.
    /// Planning at the live entry (a watch lingering 10 s) or with no deadline instead
    /// would make the next grant wake the task to plan again: a turn per lock cycle at one
    /// task (measured). Planned this way, short holds taken more often than every
    /// `soonest` cost about one turn per `soonest`; sparser ones up to two each (the
    /// grant's wake-up, and one at the horizon that finds nothing). Once no stale entry
    /// later than `now` is left, the plan is the earliest live entry, or none. Waking
    /// early is harmless: the task runs what is due and plans again.
    ///
    /// `soonest` is about cost only, not safety: an entry queued from outside the task is
    /// always followed by [`wake_for`](Self::wake_for), which wakes the task if it would
    /// sleep past it, however soon it is due.
    pub(crate) fn plan(
        &mut self,
        now: Instant,
        soonest: Duration,
        is_live: impl Fn(Instant, &Name) -> bool,
    ) -> Option<Instant> {
        let mut stale_later = false;
        while let Some(Reverse((at, name))) = self.queue.peek() {
            if is_live(*at, name) {
                break;
            }
            stale_later |= *at > now;
            self.queue.pop();
        }
        let live = self.queue.peek().map(|Reverse((at, _))| *at);
        let next = if stale_later {
            let horizon = now + soonest;
            Some(live.map_or(horizon, |live| live.min(horizon)))
        } else {
            live
        };
        self.planned = next;
        next
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const DEFER: Duration = Duration::from_millis(100);

    fn name(text: &str) -> Name {
        Arc::from(text.as_bytes())
    }

    #[test]
    fn the_task_wakes_for_a_time_only_if_it_would_sleep_past_it() {
        let now = Instant::now();
        let mut timers = Timers::default();
        assert!(timers.wake_for(now + Duration::from_secs(1)), "no deadline");
        assert!(
            !timers.wake_for(now + Duration::from_secs(2)),
            "already earlier"
        );
        assert!(timers.wake_for(now + Duration::from_millis(500)), "sooner");
    }

    #[test]
    fn the_plan_is_the_earliest_live_entry_and_stale_ones_before_it_go() {
        let now = Instant::now();
        let mut timers = Timers::default();
        let (a, b) = (
            now + Duration::from_millis(10),
            now + Duration::from_millis(20),
        );
        timers.push(a, name("stale"));
        timers.push(b, name("live"));
        // Planned once the stale entry's time has come: the live one is next.
        assert_eq!(timers.plan(a, DEFER, |_, n| &**n == b"live"), Some(b));
        assert_eq!(timers.pop_due(b), Some((b, name("live"))));
        assert_eq!(timers.pop_due(b), None, "the stale one went at planning");
    }

    #[test]
    fn a_stale_entry_later_than_now_brings_the_plan_before_a_later_live_one() {
        let now = Instant::now();
        let mut timers = Timers::default();
        let linger = now + Duration::from_secs(10);
        timers.push(linger, name("idle"));
        let stale = now + Duration::from_millis(100);
        timers.push(stale, name("released"));
        assert_eq!(timers.plan(now, DEFER, |_, n| &**n == b"idle"), Some(stale));
        // A grant made since is due after the stale entry: no wake-up for it.
        assert!(!timers.wake_for(stale + Duration::from_millis(1)));
        // At the stale entry's time, nothing stale is later: the live one is next.
        assert_eq!(timers.pop_due(stale), None, "dropped when planned");
        assert_eq!(
            timers.plan(stale, DEFER, |_, n| &**n == b"idle"),
            Some(linger)
        );
    }

    #[test]
    fn with_only_stale_entries_the_task_wakes_one_soonest_later_not_for_each_hold() {
        let now = Instant::now();
        let defer = Duration::from_millis(100);
        let mut timers = Timers::default();
        // A hold: the task sleeps with no deadline, so it is woken.
        timers.push(now + defer, name("p"));
        assert!(timers.wake_for(now + defer));
        // Released before the task ran: its entry is stale when the task plans.
        assert_eq!(timers.plan(now, defer, |_, _| false), Some(now + defer));
        // Every later hold is due after that: none wakes the task.
        for i in 1..100u32 {
            let at = now + Duration::from_micros(250) * i + defer;
            timers.push(at, name("p"));
            assert!(!timers.wake_for(at), "hold {i} woke the task");
        }
        // Nothing stale later than now: the task sleeps with no deadline.
        assert_eq!(timers.plan(now + defer * 3, defer, |_, _| false), None);
        assert!(timers.wake_for(now + defer * 4), "and a new time wakes it");
    }

    #[test]
    fn slow_short_holds_cost_a_turn_per_soonest_not_one_each() {
        // A grant every 60 ms (between half of DEFER and DEFER: planning at the latest
        // stale time instead costs one turn per hold there), each released 1 ms later,
        // and the task as the hub runs it:
        // woken by a grant, it plans after the release; at its planned time it runs what
        // is due and plans again.
        let start = Instant::now();
        let mut timers = Timers::default();
        let (mut turns, mut planned) = (0u32, None::<Instant>);
        for i in 0..100u32 {
            let grant = start + Duration::from_millis(60) * i;
            while let Some(at) = planned.filter(|at| *at <= grant) {
                turns += 1;
                while timers.pop_due(at).is_some() {}
                planned = timers.plan(at, DEFER, |_, _| false);
            }
            timers.push(grant + DEFER, name("p"));
            if timers.wake_for(grant + DEFER) {
                turns += 1;
                let released = grant + Duration::from_millis(1);
                planned = timers.plan(released, DEFER, |_, _| false);
            }
        }
        // 6 s of holds: about one turn per DEFER (60), not one per hold (100).
        assert!(turns <= 65, "{turns} turns for 100 holds in 6 s");
    }
}
