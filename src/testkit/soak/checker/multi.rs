//! Several locks at once (`lock_all`): one transaction puts a key in every lock's queue,
//! so every key of one attempt has the same create revision, and that revision is every
//! name's token (docs/etcd.md, "Several locks at once"). The rules every single lock's
//! key is held to (exclusion, holding, deletions, key left, progress) apply to each key;
//! these are the multi acquisition's own.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{Event, Life, prefix_of};
use super::{Ctx, Verdict};

/// What a `lock_all` whose join found its keys already there fails with
/// (`etcd/lock_all.rs`, `read_answer`): it claims an earlier attempt of its own put them.
pub(super) const EARLIER_ATTEMPT: &str =
    "an earlier attempt of the join without an answer put its keys";

/// How much later than the client the recorder may hear of a change (as `holding.rs`
/// allows for a deletion).
const RECORDER_LAG: std::time::Duration = std::time::Duration::from_secs(5);

/// **multi join**: the keys of every attempt of a `lock_all` acquisition (its keys, by
/// create revision) are one key per name it asked for: one transaction, all or nothing.
/// **multi grant**: its grant holds every name, once each, with one token, the create
/// revision of every key (the token rule checks each key's). **multi retry**: a join
/// refused because its keys were already there found keys an earlier attempt of its own
/// had put (anything else is a name given back while its key stood).
pub(super) fn joins_and_grants(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let mut multi: Vec<(&u64, &&[String])> = ctx.multi.iter().collect();
    multi.sort();
    for (id, names) in multi {
        let wanted: BTreeSet<Vec<u8>> = names.iter().map(|name| ctx.prefix(name)).collect();
        let shown = names.join(",");
        let mut attempts: BTreeMap<i64, Vec<&Life>> = BTreeMap::new();
        for life in ctx.of_acquisition.get(id).into_iter().flatten() {
            attempts.entry(life.created).or_default().push(life);
        }
        for (revision, keys) in &attempts {
            verdict.count("multi join");
            let made: BTreeSet<Vec<u8>> = keys.iter().map(|life| life.prefix.clone()).collect();
            if keys.len() != wanted.len() || made != wanted {
                let at = keys.iter().map(|life| life.created_seen).min();
                let listed: Vec<String> = keys
                    .iter()
                    .map(|life| String::from_utf8_lossy(&life.key).into_owned())
                    .collect();
                verdict.fail(
                    at.unwrap_or(ctx.ended),
                    format!(
                        "multi join: acquisition {id} of {shown} made {listed:?} at revision \
                         {revision}, not one key per name in one transaction\n{}",
                        ctx.dump(&keys[0].prefix, *revision)
                    ),
                );
            }
        }
        retry(ctx, verdict, *id, &shown, &attempts);
        let grants = ctx.grants_of(*id);
        let Some(first) = grants.first() else {
            continue;
        };
        verdict.count("multi grant");
        let tokens: BTreeSet<i64> = grants.iter().map(|grant| grant.token).collect();
        let held: BTreeSet<Vec<u8>> = grants
            .iter()
            .map(|grant| prefix_of(grant.key.as_bytes(), ctx.namespace))
            .collect();
        if tokens.len() != 1 || grants.len() != wanted.len() || held != wanted {
            let listed: Vec<String> = grants
                .iter()
                .map(|grant| format!("{} (token {})", grant.key, grant.token))
                .collect();
            verdict.fail(
                first.at,
                format!(
                    "multi grant: client {} was granted {shown} (acquisition {id}) as \
                     {listed:?}: not every name once, with one token\n{}",
                    first.client,
                    ctx.dump(&prefix_of(first.key.as_bytes(), ctx.namespace), first.token)
                ),
            );
        }
    }
}

/// **multi retry**: acquisition `id` (of `shown`), if it failed saying an earlier attempt
/// of its join had put its keys, had keys of its own made (`attempts`) by then.
fn retry(
    ctx: &Ctx<'_>,
    verdict: &mut Verdict,
    id: u64,
    shown: &str,
    attempts: &BTreeMap<i64, Vec<&Life>>,
) {
    for event in ctx.events {
        let Event::Failed {
            id: failed,
            at,
            error,
            ..
        } = event
        else {
            continue;
        };
        if *failed != id || !error.contains(EARLIER_ATTEMPT) {
            continue;
        }
        verdict.count("multi retry");
        let made_before = |life: &&Life| life.created_seen <= *at + RECORDER_LAG;
        if !attempts.values().flatten().any(made_before) {
            verdict.fail(
                *at,
                format!(
                    "multi retry: acquisition {id} of {shown} failed saying an earlier attempt \
                     had put its keys, but no key of it had been made: {error}"
                ),
            );
        }
    }
}
