//! What a holder was told and said: `is_held()`, `lost()`, and its release. A guard of
//! several locks (`lock_all`) says it holds only while it holds every one, and its
//! release releases all: each of its keys is held to the rules here.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::model::{Event, Outcome};
use super::{Ctx, HeldBound, RELEASE_SLACK, Verdict};
use crate::LossReason;

/// **holding**: once `lost()` has resolved, `is_held()` says false for good.
pub(super) fn after_loss(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let mut lost_at: HashMap<u64, Instant> = HashMap::new();
    for event in ctx.events {
        match event {
            Event::Lost { id, at, .. } => {
                lost_at.entry(*id).or_insert(*at);
            }
            Event::Held { id, at, held } => {
                let Some(since) = lost_at.get(id) else {
                    continue;
                };
                verdict.count("held after loss");
                let grants = ctx.grants_of(*id);
                if let (true, Some(grant)) = (*held, grants.first()) {
                    let keys: Vec<&str> = grants.iter().map(|g| g.key.as_str()).collect();
                    verdict.fail(
                        *at,
                        format!(
                            "holding: client {}'s is_held() said true for {} (token {}) {:?} \
                             after its lost() resolved",
                            grant.client,
                            keys.join(", "),
                            grant.token,
                            at.duration_since(*since)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// **release** (its key's end): a key outlives its release by at most its lease (a
/// delete that cannot get through leaves the key to its lease) plus retries, plus a
/// revocation of the clients' write permission meanwhile (a refused delete is retried by
/// the sweep once restored).
pub(super) fn key_after_release(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for event in ctx.events {
        let Event::Released {
            id,
            ended: returned,
            ..
        } = event
        else {
            continue;
        };
        for grant in ctx.grants_of(*id) {
            let Some(life) = ctx.life_of(grant) else {
                continue;
            };
            verdict.count("key after release");
            let bound = grant.ttl + RELEASE_SLACK;
            let bound = bound + ctx.operator.revoked_slack(*returned, *returned + bound);
            // Never deleted: the leftovers check speaks for a key still there at the end.
            let gone = life.deleted.map_or(ctx.ended, |(_, seen)| seen);
            if gone > *returned + bound {
                verdict.fail(
                    *returned + bound,
                    format!(
                        "release: client {}'s key {} (token {}) was still there {:?} after its \
                         release returned (bound {bound:?})\n{}",
                        grant.client,
                        grant.key,
                        grant.token,
                        gone.duration_since(*returned),
                        ctx.report(life, life.created)
                    ),
                );
            }
        }
    }
}

/// **holding**: `is_held()` says false within [`HeldBound`] of its key's deletion, and
/// `lost()` names a key deletion only if there was one; **release**: a release reported
/// `Released` deleted a key that was still there.
pub(super) fn claims(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for event in ctx.events {
        match event {
            // (Every key of a guard of several locks: it says it holds all.)
            Event::Held { id, at, held: true } => {
                for grant in ctx.grants_of(*id) {
                    let Some(life) = ctx.life_of(grant) else {
                        continue;
                    };
                    verdict.count("holding");
                    let Some((revision, seen)) = life.deleted else {
                        continue;
                    };
                    let bound = HeldBound::for_ttl(grant.ttl);
                    if *at > seen + bound {
                        verdict.fail(
                            *at,
                            format!(
                                "holding: client {}'s is_held() said true for {} (token {}) {:?} \
                             after its key was deleted at revision {revision} (bound \
                             {bound:?})\n{}",
                                grant.client,
                                grant.key,
                                grant.token,
                                at.duration_since(seen),
                                ctx.report(life, revision)
                            ),
                        );
                    }
                }
            }
            // (A guard of several locks names the lock: that one's key.)
            Event::Lost {
                id,
                at,
                reason: LossReason::KeyDeleted,
                key,
            } => {
                for grant in ctx.grants_with_key(*id, key) {
                    let Some(life) = ctx.life_of(grant) else {
                        continue;
                    };
                    verdict.count("holding");
                    // The recorder may hear of a deletion a little after the client does.
                    // (3 s of silence before the recorder opens another watch, and its reopen.)
                    let heard_late = |seen: Instant| seen > *at + Duration::from_secs(5);
                    if life.deleted.is_none_or(|(_, seen)| heard_late(seen)) {
                        verdict.fail(
                            *at,
                            format!(
                                "holding: client {} was told its key {} (token {}) was deleted, \
                                 before it was (deleted: {:?})",
                                grant.client,
                                grant.key,
                                grant.token,
                                life.deleted.map(|(d, _)| d)
                            ),
                        );
                    }
                }
            }
            // (Several locks are released only if every one was.)
            Event::Released {
                id,
                started,
                outcome: Outcome::Released,
                ..
            } => {
                for grant in ctx.grants_of(*id) {
                    let Some(life) = ctx.life_of(grant) else {
                        continue;
                    };
                    verdict.count("release");
                    match life.deleted {
                        None => verdict.fail(
                            *started,
                            format!(
                                "release: client {} released {} (token {}), and its key was never \
                         deleted",
                                grant.client, grant.key, grant.token
                            ),
                        ),
                        // Someone else deleted it long before: the release found nothing of
                        // its own to delete, and should have said so.
                        Some((revision, seen))
                            if seen + HeldBound::for_ttl(grant.ttl) < *started =>
                        {
                            verdict.fail(
                            *started,
                            format!(
                                "release: client {} reported {} (token {}) released, but its key \
                             had been deleted at revision {revision}, {:?} before the release",
                                grant.client,
                                grant.key,
                                grant.token,
                                started.duration_since(seen)
                            ),
                        );
                        }
                        Some(_) => {}
                    }
                }
            }
            _ => {}
        }
    }
}
