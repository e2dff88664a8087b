//! A renewal round's answers, lock by lock, as they come from each server: a lock is
//! decided once a quorum has renewed it, or once so many servers found it no longer ours
//! that a quorum cannot renew it.
//!
//! Answers are counted as they come, a script call's worth at a time, not when the round
//! ends: a round can take long (many locks, a slow server or link), and a lock answered
//! early must have its deadline moved on then, not after the rest of the round, which
//! may come after that deadline (`tests/redis/renewal_slow_link.rs`). A renewal counts
//! from when its call was sent, not from the round's start: a server runs a call after
//! it was sent, so a quorum holds the key at least until the earliest of its renewing
//! calls' sending plus the TTL. Counted from the round's start, a round taking half the
//! TTL would leave the locks of its last calls too little time, however fast the next
//! round renewed them.

use std::sync::{Mutex, PoisonError};

use crate::lease_clock::ClockInstant;

/// What a round's answers decided for one of its locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A quorum renewed it, the earliest of their calls sent at `since`.
    Renewed { since: ClockInstant },
    /// So many servers found it no longer ours that a quorum cannot renew it.
    NotOurs,
}

/// The answers of one round's servers, per lock.
#[derive(Debug)]
pub(crate) struct RoundTally {
    quorum: usize,
    nodes: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    /// Per lock, how many servers renewed it, and how many found it no longer ours.
    yes: Vec<u16>,
    no: Vec<u16>,
    /// Per lock, when the earliest call that renewed it was sent.
    since: Vec<Option<ClockInstant>>,
    undecided: usize,
    renewed: usize,
}

impl RoundTally {
    /// A round of `locks` locks over `nodes` servers, decided at `quorum`.
    pub(crate) fn new(locks: usize, quorum: usize, nodes: usize) -> Self {
        Self {
            quorum,
            nodes,
            counts: Mutex::new(Counts {
                yes: vec![0; locks],
                no: vec![0; locks],
                since: vec![None; locks],
                undecided: locks,
                renewed: 0,
            }),
        }
    }

    /// Counts one server's `answers` for the round's locks from `first` on (`true`:
    /// renewed), given by a call sent at `sent`; returns the locks (their index in the
    /// round) these answers decide.
    pub(crate) fn record(
        &self,
        first: usize,
        answers: &[bool],
        sent: ClockInstant,
    ) -> Vec<(usize, Verdict)> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = &mut *counts;
        let mut decided = Vec::new();
        for (i, renewed) in (first..).zip(answers) {
            let (Some(yes), Some(no), Some(since)) = (
                counts.yes.get_mut(i),
                counts.no.get_mut(i),
                counts.since.get_mut(i),
            ) else {
                break;
            };
            let was = decided_by(*yes, *no, self.quorum, self.nodes);
            if *renewed {
                *yes = yes.saturating_add(1);
                *since = Some(since.map_or(sent, |earlier| earlier.min(sent)));
            } else {
                *no = no.saturating_add(1);
            }
            let now = decided_by(*yes, *no, self.quorum, self.nodes);
            let verdict = match (was, now, *since) {
                (None, Some(true), Some(since)) => Verdict::Renewed { since },
                (None, Some(false), _) => Verdict::NotOurs,
                _ => continue,
            };
            counts.undecided -= 1;
            if matches!(verdict, Verdict::Renewed { .. }) {
                counts.renewed += 1;
            }
            decided.push((i, verdict));
        }
        decided
    }

    /// How many of the round's locks are not decided yet.
    pub(crate) fn undecided(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .undecided
    }

    /// How many of the round's locks a quorum renewed so far.
    pub(crate) fn renewed(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .renewed
    }
}

/// Whether `yes` renewals and `no` refusals out of `nodes` servers decide a lock at
/// `quorum`, and how: `Some(true)` renewed, `Some(false)` no longer ours.
fn decided_by(yes: u16, no: u16, quorum: usize, nodes: usize) -> Option<bool> {
    let (yes, no) = (usize::from(yes), usize::from(no));
    if yes >= quorum {
        Some(true)
    } else if no > nodes - quorum {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease_clock::Clock;

    #[test]
    fn a_lock_is_decided_once_by_the_answer_that_settles_it() {
        let t0 = Clock::BOOT.now();
        let (t1, t2) = (
            t0 + Duration::from_millis(10),
            t0 + Duration::from_millis(20),
        );
        // Redlock: three masters, a quorum of two; four locks.
        let tally = RoundTally::new(4, 2, 3);
        assert_eq!(tally.record(0, &[true, false, true, false], t1), []);
        assert_eq!(tally.undecided(), 4);
        // The second master: lock 0 renewed by two, counted from the earlier call; lock 1
        // refused by two, which a quorum cannot overcome; locks 2 and 3 split (answers
        // from 2 on only).
        assert_eq!(
            tally.record(0, &[true, false], t0),
            [(0, Verdict::Renewed { since: t0 }), (1, Verdict::NotOurs)]
        );
        assert_eq!(tally.record(2, &[false, true], t2), []);
        // The third master settles the split ones; its answers for the decided ones
        // decide nothing again.
        assert_eq!(
            tally.record(0, &[false, true, true, false], t2),
            [(2, Verdict::Renewed { since: t1 }), (3, Verdict::NotOurs)]
        );
        assert_eq!((tally.undecided(), tally.renewed()), (0, 2));
    }

    #[test]
    fn answers_past_the_round_are_ignored() {
        let now = Clock::BOOT.now();
        let tally = RoundTally::new(2, 1, 1);
        assert_eq!(
            tally.record(1, &[true, true, true], now),
            [(1, Verdict::Renewed { since: now })]
        );
        assert_eq!(tally.undecided(), 1);
    }
}
