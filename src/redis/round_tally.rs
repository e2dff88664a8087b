//! A renewal round's answers, lock by lock, as they come from each server: a lock is
//! decided once a quorum has renewed it, or once so many servers found it no longer ours
//! that a quorum cannot renew it.
//!
//! Answers are counted as they come, a script call's worth at a time, not when the round
//! ends: a round can take long (many locks, a slow server or link), and a lock answered
//! early must have its deadline moved on then, not after the rest of the round, which
//! may come after that deadline (`tests/redis/renewal_slow_link.rs`).

use std::sync::{Mutex, PoisonError};

/// What a round's answers decided for one of its locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A quorum renewed it.
    Renewed,
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
                undecided: locks,
                renewed: 0,
            }),
        }
    }

    /// Counts one server's `answers` for the round's locks from `first` on (`true`:
    /// renewed); returns the locks (their index in the round) these answers decide.
    pub(crate) fn record(&self, first: usize, answers: &[bool]) -> Vec<(usize, Verdict)> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = &mut *counts;
        let mut decided = Vec::new();
        for (i, renewed) in (first..).zip(answers) {
            let (Some(yes), Some(no)) = (counts.yes.get_mut(i), counts.no.get_mut(i)) else {
                break;
            };
            let was = decides(usize::from(*yes), usize::from(*no), self.quorum, self.nodes);
            if *renewed {
                *yes = yes.saturating_add(1);
            } else {
                *no = no.saturating_add(1);
            }
            let now = decides(usize::from(*yes), usize::from(*no), self.quorum, self.nodes);
            if let (None, Some(verdict)) = (was, now) {
                counts.undecided -= 1;
                if verdict == Verdict::Renewed {
                    counts.renewed += 1;
                }
                decided.push((i, verdict));
            }
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

/// What `yes` renewals and `no` refusals out of `nodes` servers decide at `quorum`.
fn decides(yes: usize, no: usize, quorum: usize, nodes: usize) -> Option<Verdict> {
    if yes >= quorum {
        Some(Verdict::Renewed)
    } else if no > nodes - quorum {
        Some(Verdict::NotOurs)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_decided_once_by_the_answer_that_settles_it() {
        // Redlock: three masters, a quorum of two; four locks.
        let tally = RoundTally::new(4, 2, 3);
        assert_eq!(tally.record(0, &[true, false, true, false]), []);
        assert_eq!(tally.undecided(), 4);
        // The second master: lock 0 renewed by two; lock 1 refused by two, which a quorum
        // cannot overcome; locks 2 and 3 split (answers from 2 on only).
        assert_eq!(
            tally.record(0, &[true, false]),
            [(0, Verdict::Renewed), (1, Verdict::NotOurs)]
        );
        assert_eq!(tally.record(2, &[false, true]), []);
        // The third master settles the split ones; its answers for the decided ones
        // decide nothing again.
        assert_eq!(
            tally.record(0, &[false, true, true, false]),
            [(2, Verdict::Renewed), (3, Verdict::NotOurs)]
        );
        assert_eq!((tally.undecided(), tally.renewed()), (0, 2));
    }

    #[test]
    fn answers_past_the_round_are_ignored() {
        let tally = RoundTally::new(2, 1, 1);
        assert_eq!(
            tally.record(1, &[true, true, true]),
            [(1, Verdict::Renewed)]
        );
        assert_eq!(tally.undecided(), 1);
    }
}
