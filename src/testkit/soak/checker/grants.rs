//! What a grant claims: its token, that it was admitted, that its token is its own, that
//! its key is its own.

use std::collections::HashMap;

use super::model::{Grant, Life, acquisition_of};
use super::queue::{Share, admits, share};
use super::{Ctx, Verdict};

/// **token**: a grant's token is the create revision of a key of its name; **exclusion**:
/// at the revision the grant was decided its key was alive and the keys ahead of it
/// admitted it.
pub(super) fn token_and_exclusion(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for grant in ctx.every_grant() {
        verdict.count("token");
        let Some(life) = ctx.life_of(grant) else {
            verdict.fail(
                grant.at,
                format!(
                    "token: client {} was granted {} with token {}, but no key of that name was \
                 created at that revision",
                    grant.client, grant.key, grant.token
                ),
            );
            continue;
        };
        verdict.count("exclusion");
        let revision = grant.admitted;
        if !life.alive_at(revision) {
            verdict.fail(grant.at, format!(
                "exclusion: client {} was granted {} (token {}) at revision {revision}, when its \
                 key did not exist (deleted at {:?})\n{}",
                grant.client,
                grant.key,
                grant.token,
                life.deleted.map(|(d, _)| d),
                ctx.report(life, revision)
            ));
            continue;
        }
        let ahead: Vec<&Life> = ctx
            .by_prefix
            .get(life.prefix.as_slice())
            .into_iter()
            .flatten()
            .map(|i| &ctx.lives[*i])
            // An equal create revision is ahead too: two keys of one name made in one
            // transaction (two joins batched together) share a token, and neither may
            // pass the other.
            .filter(|other| {
                other.created <= life.created && other.key != life.key && other.alive_at(revision)
            })
            .collect();
        let shares: Vec<Share> = ahead.iter().map(|other| share(&other.value)).collect();
        if !admits(share(&life.value), &shares) {
            let names: Vec<String> = ahead
                .iter()
                .map(|o| format!("{}@{}", String::from_utf8_lossy(&o.key), o.created))
                .collect();
            verdict.fail(
                grant.at,
                format!(
                    "exclusion: client {} was granted {} (token {}) at revision {revision} while \
                 {names:?} were ahead of it\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    ctx.report(life, revision)
                ),
            );
        }
    }
}

/// **duplicate token**: a token is one grant of one name, ever. Two grants of one name
/// with equal tokens are one key handed out twice (a name reused while its old key
/// stood) or two keys made in one transaction; either way their fences cannot tell them
/// apart.
pub(super) fn duplicate_tokens(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    let mut by_token: HashMap<(&[u8], i64), &Grant> = HashMap::new();
    let mut ordered: Vec<&Grant> = ctx.every_grant().collect();
    ordered.sort_by_key(|g| (g.at, g.id));
    for grant in ordered {
        let Some(life) = ctx.life_of(grant) else {
            continue;
        };
        verdict.count("duplicate token");
        if let Some(first) = by_token.insert((life.prefix.as_slice(), grant.token), grant) {
            verdict.fail(
                grant.at,
                format!(
                    "duplicate token: client {} was granted {} with token {}, which client {} had \
                 already been granted for {} (another acquisition)\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    first.client,
                    first.key,
                    ctx.report(life, grant.token)
                ),
            );
        }
    }
}

/// **ownership**: every acquisition's id rides in its key's value (the holder record's
/// label, an election's value): a grant's key names that grant's acquisition, never an
/// earlier acquisition's key taken for its own.
pub(super) fn ownership(ctx: &Ctx<'_>, verdict: &mut Verdict) {
    for grant in ctx.every_grant() {
        let Some(life) = ctx.life_of(grant) else {
            continue;
        };
        verdict.count("ownership");
        if let Some(other) = acquisition_of(&life.value).filter(|other| *other != grant.id) {
            verdict.fail(
                grant.at,
                format!(
                    "ownership: client {} was granted {} (token {}), a key acquisition {other} \
                 made, not its own ({})\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    grant.id,
                    ctx.report(life, life.created)
                ),
            );
        }
    }
}
