//! Keys nobody should keep: a name found standing, a key its acquisition gave up on, a
//! key left after the run.

use tokio::time::Instant;

use super::model::Event;
use super::{Ctx, LONGEST_TTL, RELEASE_SLACK, Verdict};

/// **name reuse**: a join that finds its own key already there, although no attempt of
/// it went unanswered, met a name its session used before while that name's key stood (a
/// name given back too early): the library refuses the key rather than take an earlier
/// grant's token, but the name should never have been given back.
pub(super) fn name_reuse(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for event in ctx.events {
        let Event::Failed {
            client,
            name,
            at,
            error,
            ..
        } = event
        else {
            continue;
        };
        verdict.count("name reuse");
        if error.contains("already exists although every attempt") {
            verdict.fail(*at, format!(
                "name reuse: client {client}'s acquisition of {name} found a key of its own name \
                 standing: {error}"
            ));
        }
    }
}

/// **key left**: a key of an acquisition that returned without the lock (busy, timed
/// out, failed) goes soon after the acquisition returned, or after it appeared (a join
/// applied late, after the acquisition gave up and removed what was there): the
/// acquisition's cleanup and the session's sweep remove it, or its lease takes it; never
/// a key nobody owns left under a lease that is renewed.
pub(super) fn key_left(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for (id, at) in &ctx.returned {
        let Some(lives) = ctx.of_acquisition.get(id) else {
            continue;
        };
        for life in lives {
            verdict.count("key left");
            let from = (*at).max(life.created_seen);
            let bound = LONGEST_TTL + RELEASE_SLACK;
            let bound = bound + ctx.operator.revoked_slack(from, from + bound);
            let gone = life.deleted.map_or(ctx.ended, |(_, seen)| seen);
            if gone > from + bound {
                verdict.fail(
                    from + bound,
                    format!(
                        "key left: key {} (created {}) of acquisition {id}, which returned \
                 without the lock, was still there {:?} after (bound {bound:?})\n{}",
                        String::from_utf8_lossy(&life.key),
                        life.created,
                        gone.duration_since(from),
                        ctx.report(life, life.created)
                    ),
                );
            }
        }
    }
}

/// **leftovers**: after the run settled (`ended`), no key is `left`.
pub(super) fn leftovers(left: &[String], ended: Instant, verdict: &mut Verdict) {
    verdict.count("leftovers");
    for key in left {
        verdict.fail(
            ended,
            format!("leftovers: key {key} was still there after the run settled"),
        );
    }
}
