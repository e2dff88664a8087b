//! **progress**: nobody waits for ever.
//!
//! A single lock's key is free to be granted from the revision the history first admits
//! it (the keys ahead gone, or sharing with it). A key of a `lock_all` is not: the
//! acquisition holds once *every* one of its keys is admitted, so a key at the head of
//! one queue while another of its transaction still waits is no stall of that queue (the
//! queue waits for the other one's predecessors, each checked in its own queue). Its
//! bound runs from the revision at which every key of its transaction is admitted and
//! alive; if that never comes (one of them went first: a timeout, a key deleted under
//! it), from when the first of them went (the acquisition has failed: every other key of
//! it must go soon); and while one of them still waits at the end, the waiting one's own
//! queue speaks for it.
//!
//! A key whose acquisition had returned without the lock (a try refused, a wait timed
//! out, a failure) by the end of that bound is not a waiter's: nobody waits on it, and
//! its removal is the acquisition's cleanup (retried through whatever faults stand in
//! its way) or its session's sweep, held to their own bound by **key left**
//! (`keys.rs`). Held to this one as well, a cleanup slowed by faults stacked one after
//! another (two members killed in turn, the client's paths to the third faulted) failed
//! here within key left's bound. A waiter that misses its turn is still caught: it
//! returns (times out) later than the bound, or never.

use std::collections::HashMap;

use super::model::{Grant, Life, acquisition_of, revision_times};
use super::queue::first_admission;
use super::{Ctx, STALL_BOUND, Verdict};

/// When the keys of one `lock_all` transaction could all be held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Together {
    /// At this revision every key was admitted and alive: the acquisition may hold.
    Admitted(i64),
    /// Never: a key went at this revision before every key was admitted.
    Broken(i64),
    /// Not yet when the history ends: a key still waits and none went.
    Waiting,
}

/// **progress**: every key admitted by the history is granted, or gone, within
/// [`STALL_BOUND`] (plus a revocation of the clients' write permission meanwhile); a key
/// of a `lock_all` from when every key of its transaction is admitted (module docs).
pub(super) fn progress(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let granted: HashMap<(&[u8], i64), &Grant> = ctx
        .every_grant()
        .map(|g| ((g.key.as_bytes(), g.token), g))
        .collect();
    let seen_at = revision_times(ctx.history);
    let admission = |life: &Life| {
        ctx.by_prefix
            .get(life.prefix.as_slice())
            .and_then(|peers| first_admission(life, peers, ctx.lives))
    };
    for life in ctx.lives {
        verdict.count("progress");
        let Some(mut admitted) = admission(life) else {
            continue;
        };
        let mut with = "";
        if let Some(fellows) = transaction_of(ctx, life) {
            verdict.count("progress of lock_all");
            match together(&fellows, &admission) {
                Together::Admitted(all) => {
                    admitted = all;
                    with = " with every key of its lock_all";
                }
                Together::Broken(gone) => {
                    admitted = admitted.max(gone);
                    with = ", its lock_all failed (a key of it went),";
                }
                Together::Waiting => continue,
            }
        }
        let since = seen_at.get(&admitted).copied().unwrap_or(life.created_seen);
        let until = match granted.get(&(life.key.as_slice(), life.created)) {
            // Granted: when the client was told.
            Some(grant) => grant.at,
            None => life.deleted.map_or(ctx.ended, |(_, seen)| seen),
        };
        let bound = STALL_BOUND + ctx.operator.revoked_slack(since, since + STALL_BOUND);
        let gave_up = acquisition_of(&life.value)
            .and_then(|id| ctx.returned.get(&id))
            .is_some_and(|at| *at <= since + bound);
        if gave_up {
            // Nobody waits on it: key left's (module docs).
            verdict.count("progress, left to key left");
            continue;
        }
        if until > since + bound {
            let who = if granted.contains_key(&(life.key.as_slice(), life.created)) {
                "its waiter was granted only"
            } else {
                "nobody took it; it went only"
            };
            verdict.fail(
                since + STALL_BOUND,
                format!(
                    "progress: key {} (created {}) was admitted{with} at revision {admitted}, and \
                     {who} {:?} later\n{}",
                    String::from_utf8_lossy(&life.key),
                    life.created,
                    until.duration_since(since),
                    ctx.report(life, admitted)
                ),
            );
        }
    }
}

/// Every key of the `lock_all` transaction that made `life`'s key (itself included: the
/// keys of its acquisition with its create revision); `None` for any other key.
fn transaction_of<'a>(ctx: &Ctx<'a>, life: &Life) -> Option<Vec<&'a Life>> {
    let id = acquisition_of(&life.value)?;
    if !ctx.multi.contains_key(&id) {
        return None;
    }
    let fellows = ctx.of_acquisition.get(&id)?;
    Some(
        fellows
            .iter()
            .copied()
            .filter(|fellow| fellow.created == life.created)
            .collect(),
    )
}

/// When the keys of one transaction (`fellows`) could all be held, each admitted from
/// the revision `admission` gives.
fn together(fellows: &[&Life], admission: &dyn Fn(&Life) -> Option<i64>) -> Together {
    let admitted: Option<Vec<i64>> = fellows.iter().map(|fellow| admission(fellow)).collect();
    // Once admitted, a key stays admitted while it lives (keys ahead only leave): at the
    // last admission every key is admitted, if every one still lives.
    if let Some(all) = admitted.and_then(|revisions| revisions.into_iter().max()) {
        if fellows.iter().all(|fellow| fellow.alive_at(all)) {
            return Together::Admitted(all);
        }
    }
    fellows
        .iter()
        .filter_map(|fellow| fellow.deleted.map(|(revision, _)| revision))
        .min()
        .map_or(Together::Waiting, Together::Broken)
}
