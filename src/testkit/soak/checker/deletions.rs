//! Who deleted a key: a deletion the clients were not meant to make is someone's late
//! request (a key taken away from its holder or waiter). Each key of a `lock_all` is held
//! to these rules as a single lock's key is.

use std::time::Duration;

use super::model::{Event, Outcome, prefix_of};
use super::{Ctx, Verdict};
use crate::LossReason;

/// **deletion**: a held key that went before its release began went with its lease or by
/// the operator's hand; anything else is a request of someone else's.
pub(super) fn before_release(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for event in ctx.events {
        let Event::Released { id, started, .. } = event else {
            continue;
        };
        for grant in ctx.grants_of(*id) {
            let Some(life) = ctx.life_of(grant) else {
                continue;
            };
            let Some((revision, seen)) = life.deleted else {
                continue;
            };
            verdict.count("deletion");
            // Seen before the release began: certainly not the release's own delete.
            if seen >= *started {
                continue;
            }
            if life.deleted_by_client {
                verdict.fail(
                seen,
                format!(
                    "deletion: client {}'s key {} (token {}) was deleted at revision {revision}, \
                 {:?} before its release began, by a request of the clients (a sweep, or \
                 another acquisition's delete)\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    started.duration_since(seen),
                    ctx.report(life, revision)
                ),
            );
                continue;
            }
            if ctx.operator.explains(life, revision, seen) {
                continue;
            }
            if !ctx.lease_ended(life, revision) {
                verdict.fail(
                seen,
                format!(
                    "deletion: client {}'s key {} (token {}) was deleted at revision {revision}, \
                 {:?} before its release began, by neither the operator nor its lease's end\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    started.duration_since(seen),
                    ctx.report(life, revision)
                ),
            );
            }
        }
    }
}

/// **foreign delete**: a key an acquisition was told was deleted under it (while it
/// waited, or held: `lost()`, or a release that found nothing to delete although every
/// attempt was answered) went by the operator's hand or with its lease, never by a
/// request of another acquisition (a late delete of an earlier key of the same name),
/// nor by the clients' own (then it was not gone when it was told).
pub(super) fn foreign(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let mut deleted_under = Vec::new();
    for event in ctx.events {
        match event {
            Event::Failed {
                id,
                at,
                key_deleted: true,
                deleted_lock,
                ..
            } => {
                // Several locks: the key of the lock the error named (none named: which
                // one is not known).
                let prefix = match (ctx.multi.contains_key(id), deleted_lock) {
                    (false, _) => None,
                    (true, Some(lock)) => Some(ctx.prefix(lock)),
                    (true, None) => continue,
                };
                // Its key (made before it was told).
                let life = ctx
                    .of_acquisition
                    .get(id)
                    .into_iter()
                    .flatten()
                    .filter(|life| prefix.as_ref().is_none_or(|p| life.prefix == *p))
                    .filter(|life| life.created_seen <= *at + Duration::from_secs(5))
                    // Its first: any later one is a late join of it, made after the
                    // first was gone.
                    .min_by_key(|life| life.created);
                if let Some(life) = life {
                    deleted_under.push((*at, *life, "while it waited"));
                }
            }
            Event::Lost {
                id,
                at,
                reason: LossReason::KeyDeleted,
                key,
            } => {
                for life in ctx
                    .grants_with_key(*id, key)
                    .iter()
                    .filter_map(|g| ctx.life_of(g))
                {
                    deleted_under.push((*at, life, "while it held"));
                }
            }
            Event::Released {
                id,
                started,
                outcome: Outcome::NotHeld,
                ..
            } => {
                // Several locks answer NotHeld if any one did; which one is not known.
                let when = if ctx.multi.contains_key(id) {
                    SEVERAL_SAID_NOT_HELD
                } else {
                    RELEASE_SAID_NOT_HELD
                };
                for life in ctx.grants_of(*id).iter().filter_map(|g| ctx.life_of(g)) {
                    deleted_under.push((*started, life, when));
                }
            }
            _ => {}
        }
    }
    for (at, life, when) in deleted_under {
        let Some((revision, seen)) = life.deleted else {
            continue;
        };
        // A guard that found itself lost only once its release began (its lease's local
        // deadline passed between the workload's `is_held()` and the release's own look)
        // answers NotHeld although its delete removed the key.
        if when == RELEASE_SAID_NOT_HELD && life.deleted_by_client && seen >= at {
            continue;
        }
        // Of several locks, the others were released by the same call: their keys went by
        // its deletes, answered (the clients' own) or not (an attempt without an answer
        // that the retry then found done): only a key gone before the release began was
        // surely taken away.
        if when == SEVERAL_SAID_NOT_HELD && seen >= at {
            continue;
        }
        verdict.count("foreign delete");
        if !ctx.accountable(life, revision, seen) {
            let by = if life.deleted_by_client {
                "by a request of the clients (its own cleanup or release, a sweep, another \
                 acquisition's delete), after it was told it was gone"
            } else {
                "by neither the operator nor its lease's end (another acquisition's request)"
            };
            verdict.fail(
                seen.min(at),
                format!(
                    "foreign delete: key {} (created {}) was deleted at revision {revision} \
                 {when}, {by}\n{}",
                    String::from_utf8_lossy(&life.key),
                    life.created,
                    ctx.report(life, revision)
                ),
            );
        }
    }
}

/// **seen gone**: a wait that concluded its key was gone (from a read, or a watch event,
/// at some revision) was right: the key created at its token existed, and was deleted at
/// or before that revision. (Whoever deleted it afterwards, answered or not: a wait that
/// looked for the wrong key, or misread its queue, shows here.)
pub(super) fn seen_gone(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for (key, token, revision) in &ctx.clients.seen_gone {
        if !key.starts_with(format!("{}/", ctx.namespace).as_bytes()) {
            continue;
        }
        verdict.count("seen gone");
        let life = ctx
            .by_key
            .get(key.as_slice())
            .into_iter()
            .flatten()
            .map(|i| &ctx.lives[*i])
            .find(|life| life.created == *token);
        let shown = String::from_utf8_lossy(key);
        let wrong = match life {
            None => format!("no key of that name was created at revision {token}"),
            Some(life) if life.alive_at(*revision) => {
                format!("the key created at {token} was alive at that revision")
            }
            Some(_) => continue,
        };
        let seen = life.map(|life| life.created_seen).unwrap_or(ctx.ended);
        verdict.fail(
            seen,
            format!(
                "seen gone: a wait concluded at revision {revision} that its key {shown} (token \
                 {token}) was gone, but {wrong}\n{}",
                ctx.dump(&prefix_of(key, ctx.namespace), *revision)
            ),
        );
    }
}

/// How a release that answered NotHeld (believing itself held) is named among the keys
/// deleted under their acquisitions.
const RELEASE_SAID_NOT_HELD: &str = "before its release deleted it";

/// The same, for a release of several locks (`lock_all`): one of them at least was not
/// held.
const SEVERAL_SAID_NOT_HELD: &str = "before the release of its locks deleted them";
