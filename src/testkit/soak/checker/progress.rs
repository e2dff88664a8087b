//! **progress**: nobody waits for ever.

use std::collections::HashMap;

use super::model::{Grant, revision_times};
use super::queue::first_admission;
use super::{Ctx, STALL_BOUND, Verdict};

/// **progress**: every key admitted by the history is granted, or gone, within
/// [`STALL_BOUND`] (plus a revocation of the clients' write permission meanwhile).
pub(super) fn progress(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let granted: HashMap<(&[u8], i64), &Grant> = ctx
        .grants
        .values()
        .map(|g| ((g.key.as_bytes(), g.token), *g))
        .collect();
    let seen_at = revision_times(ctx.history);
    for life in ctx.lives {
        let Some(peers) = ctx.by_prefix.get(life.prefix.as_slice()) else {
            continue;
        };
        verdict.count("progress");
        let Some(admitted) = first_admission(life, peers, ctx.lives) else {
            continue;
        };
        let since = seen_at.get(&admitted).copied().unwrap_or(life.created_seen);
        let until = match granted.get(&(life.key.as_slice(), life.created)) {
            // Granted: when the client was told.
            Some(grant) => grant.at,
            None => life.deleted.map_or(ctx.ended, |(_, seen)| seen),
        };
        let bound = STALL_BOUND + ctx.operator.revoked_slack(since, since + STALL_BOUND);
        if until > since + bound {
            let who = if granted.contains_key(&(life.key.as_slice(), life.created)) {
                "its waiter was granted only"
            } else {
                "nobody took it; it went only"
            };
            verdict.fail(
                since + STALL_BOUND,
                format!(
                    "progress: key {} (created {}) was admitted at revision {admitted}, and {who} \
                 {:?} later\n{}",
                    String::from_utf8_lossy(&life.key),
                    life.created,
                    until.duration_since(since),
                    ctx.dump(&life.prefix, admitted)
                ),
            );
        }
    }
}
