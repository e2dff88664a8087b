//! The soak's independent checker: the truth is etcd's own history (every put and delete
//! under the namespace, with its revision, as a watch from revision 1 saw it), and every
//! claim a client made is checked against it. Nothing here trusts the library: the rule
//! for who may hold beside whom is written again from the design, and a grant is checked
//! at the revision the client says it was decided at.
//!
//! Checks:
//!
//! - **token**: a grant's token is the create revision of a key of that name;
//! - **exclusion**: at the revision a grant was decided, its key was alive and the keys
//!   ahead of it (alive, created earlier) admitted it: none for a lock, a writer or a
//!   leader; only readers for a reader; fewer than N permits of the same N for a permit;
//! - **holding**: `is_held()` never says true longer than [`HeldBound`] after the key
//!   was deleted, and a lost guard's `lost()` names a key deletion only if there was one;
//! - **release**: a release reported `Released` left no key behind;
//! - **deletion**: a held key deleted before its release began was deleted by the
//!   operator (the nemesis) or with its lease (no put used the lease afterwards), never
//!   by a request nobody accounts for (a late delete of another acquisition), and never
//!   by a request the clients' answers say was theirs (`etcd::observed`);
//! - **ownership**, **foreign delete**, **key left**: whose key is whose (each key's
//!   value names its acquisition): a grant's key is its own; a key its acquisition was
//!   told was deleted went by the operator's hand or with its lease, not by any request
//!   of the clients (its own cleanup included: then it was not gone when it was told);
//!   a key of an acquisition that returned without the lock goes soon;
//! - **progress**: a key admitted by the history is granted (or gone) within
//!   [`STALL_BOUND`]: a waiter that stays in line although the keys ahead left is a lost
//!   wakeup, and a key nobody holds or waits on (a late join) blocks the lock;
//! - **leftovers**: after the run and a settling period no key is left.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use crate::LossReason;
use crate::etcd::Recorded;

/// How long a key may stay admitted without being granted or removed: the longest fault
/// that can keep a waiter from hearing (a cut path, 3 s) plus a margin.
pub(crate) const STALL_BOUND: Duration = Duration::from_secs(6);

/// How much longer than the revocation itself a key may stay (unreleased, or not taken)
/// when the clients' write permission was revoked meanwhile: the sweep's backoff (at most
/// 1 s) and its read and delete.
pub(crate) const REVOKED_SLACK: Duration = Duration::from_secs(2);

/// How long after its release returned a key may stay beyond its lease's TTL (a delete
/// that cannot get through leaves the key to its lease): retries through a cut path or a
/// killed member. A revocation of the clients' write permission adds its own length and
/// [`REVOKED_SLACK`].
pub(crate) const RELEASE_SLACK: Duration = Duration::from_secs(5);

/// The longest TTL the workload asks for (`workload::ttl`): what a key nobody removes
/// may stay for, under a lease that ends.
const LONGEST_TTL: Duration = Duration::from_secs(3);

/// How long after its key is deleted a guard may still say it holds: one lease TTL (a
/// holder cut off from every member learns by its lease deadline) plus a margin.
pub(crate) struct HeldBound;

impl HeldBound {
    pub(crate) fn for_ttl(ttl: Duration) -> Duration {
        ttl + Duration::from_millis(1500)
    }
}

/// One change under the namespace, as the recorder saw it.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) revision: i64,
    pub(crate) key: Vec<u8>,
    /// `None` for a delete.
    pub(crate) put: Option<Put>,
    /// When the recorder received it.
    pub(crate) seen: Instant,
}

/// What a put wrote.
#[derive(Clone, Debug)]
pub(crate) struct Put {
    pub(crate) create_revision: i64,
    pub(crate) value: Vec<u8>,
    pub(crate) lease: i64,
}

/// What a client was told, and what it said.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    Grant(Grant),
    /// `is_held()` answered `held` at `at`.
    Held {
        id: u64,
        at: Instant,
        held: bool,
    },
    /// `lost()` resolved with `reason` at `at`.
    Lost {
        id: u64,
        at: Instant,
        reason: LossReason,
    },
    /// Acquisition `id` failed with `error`; `key_deleted`: it was told its key was
    /// deleted while it waited.
    Failed {
        id: u64,
        client: usize,
        name: String,
        at: Instant,
        error: String,
        key_deleted: bool,
    },
    /// Acquisition `id` returned without the lock: a `try` that found it taken, or a
    /// wait that timed out.
    Missed {
        id: u64,
        at: Instant,
    },
    /// The grant's release, and what it reported.
    Released {
        id: u64,
        started: Instant,
        /// When the release returned (or the guard was dropped).
        ended: Instant,
        outcome: Outcome,
    },
}

/// A grant as its client reported it.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    pub(crate) id: u64,
    pub(crate) client: usize,
    pub(crate) key: String,
    pub(crate) token: i64,
    /// The revision the client says the grant was decided at.
    pub(crate) admitted: i64,
    pub(crate) ttl: Duration,
    pub(crate) at: Instant,
}

/// What a release reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Released,
    /// `ReleaseOutcome::NotHeld`: the release knew the key gone, or found nothing to
    /// delete although every attempt was answered.
    NotHeld,
    /// `ReleaseOutcome::Unconfirmed`: nothing found after an attempt without an answer.
    Unconfirmed,
    /// `ReleaseOutcome::NotHeld` from a guard that knew itself lost before (`is_held()`
    /// false): its own delete may have removed the key.
    KnownLost,
    Failed,
    Dropped,
}

/// One key's life, rebuilt from the history.
#[derive(Clone, Debug)]
struct Life {
    key: Vec<u8>,
    prefix: Vec<u8>,
    created: i64,
    created_seen: Instant,
    value: Vec<u8>,
    lease: i64,
    deleted: Option<(i64, Instant)>,
    /// The deletion was a request of this process's clients (`etcd::observed`): not the
    /// operator's, not its lease's end.
    deleted_by_client: bool,
}

impl Life {
    fn alive_at(&self, revision: i64) -> bool {
        self.created <= revision && self.deleted.is_none_or(|(d, _)| d > revision)
    }
}

/// Who may hold beside whom, from the key's value (the design's rule, §3 and `kind.rs`'s
/// documentation): `None` for a key that excludes everyone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    Exclusive,
    Reader,
    Permits(usize),
}

fn share(value: &[u8]) -> Share {
    // A marker may be followed by the holder's record on a line of its own.
    let value = if value.starts_with(b"fencelock:") {
        value.split(|b| *b == b'\n').next().unwrap_or(value)
    } else {
        value
    };
    if value == b"fencelock:read" {
        return Share::Reader;
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.strip_prefix("fencelock:permit/"))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .map_or(Share::Exclusive, Share::Permits)
}

fn admits(mine: Share, ahead: &[Share]) -> bool {
    match mine {
        Share::Exclusive => ahead.is_empty(),
        Share::Reader => ahead.iter().all(|s| *s == Share::Reader),
        Share::Permits(n) => ahead.len() < n && ahead.iter().all(|s| *s == Share::Permits(n)),
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Each check run, by name, and how many times.
    pub(crate) checked: Vec<(&'static str, usize)>,
    /// Every violation, with the history around it.
    pub(crate) violations: Vec<String>,
    /// When the earliest violation happened (as near as the checker can tell).
    pub(crate) first_at: Option<Instant>,
}

impl Verdict {
    fn fail(&mut self, at: Instant, violation: String) {
        self.first_at = Some(self.first_at.map_or(at, |first| first.min(at)));
        self.violations.push(violation);
    }
}

/// What the operator (the nemesis) did that may delete keys.
#[derive(Debug, Default)]
pub(crate) struct Operator {
    /// The revisions of its deletes and revokes that deleted something, and what each
    /// could delete (an answer's revision is the whole store's: a delete that removed
    /// nothing, or a revoke of a lease without keys, names someone else's change).
    pub(crate) revisions: Vec<(i64, Target)>,
    /// When its requests that got no answer were in flight, and what each could delete.
    pub(crate) unanswered: Vec<(Instant, Instant, Target)>,
    /// When the clients' write permission was revoked: a key whose delete was refused
    /// meanwhile stays until the sweep gets through after it is restored.
    pub(crate) revoked: Vec<(Instant, Instant)>,
}

impl Operator {
    /// Extra time a key may stay between `from` and `until`: the revocations of the
    /// clients' write permission that overlap that time (the nemesis's own 0.2-2 s, or
    /// longer while a restore could not get through), each with [`REVOKED_SLACK`].
    fn revoked_slack(&self, from: Instant, until: Instant) -> Duration {
        self.revoked
            .iter()
            .filter(|(a, b)| *a <= until && *b >= from)
            .map(|(a, b)| b.duration_since(*a) + REVOKED_SLACK)
            .sum()
    }

    /// Whether the operator may have made the deletion of `life`'s key at `revision`,
    /// seen at `seen`: one of its deletes or revokes was applied at that revision, or one
    /// that could delete that very key got no answer and was in flight around then.
    fn explains(&self, life: &Life, revision: i64, seen: Instant) -> bool {
        self.revisions
            .iter()
            .any(|(at, target)| *at == revision && target.covers(life))
            || self.unanswered.iter().any(|(sent, ended, target)| {
                seen >= *sent && seen <= *ended + Duration::from_secs(5) && target.covers(life)
            })
    }
}

/// What an operator request could delete.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// Every key under a prefix.
    Prefix(Vec<u8>),
    /// One key.
    Key(Vec<u8>),
    /// Every key of a lease.
    Lease(i64),
}

impl Target {
    fn covers(&self, life: &Life) -> bool {
        match self {
            Self::Prefix(prefix) => life.key.starts_with(prefix),
            Self::Key(key) => life.key == *key,
            Self::Lease(lease) => life.lease == *lease,
        }
    }
}

/// Checks `events` against `history`; `left` are the keys found after the run settled,
/// `ended` when the workload stopped, `operator` what the nemesis deleted, `clients` what
/// the clients recorded themselves: every deletion their own answered requests made, and
/// when their waits saw their keys gone.
pub(crate) fn check(
    history: &[Observed],
    events: &[Event],
    left: &[String],
    ended: Instant,
    namespace: &str,
    operator: &Operator,
    clients: &Recorded,
) -> Verdict {
    let lives = lives(history, namespace, &clients.own_deletes);
    let by_key: HashMap<&[u8], Vec<usize>> = lives.iter().enumerate().fold(
        HashMap::new(),
        |mut map: HashMap<&[u8], Vec<usize>>, (i, life)| {
            map.entry(life.key.as_slice()).or_default().push(i);
            map
        },
    );
    let by_prefix: HashMap<&[u8], Vec<usize>> = lives.iter().enumerate().fold(
        HashMap::new(),
        |mut map: HashMap<&[u8], Vec<usize>>, (i, life)| {
            map.entry(life.prefix.as_slice()).or_default().push(i);
            map
        },
    );
    let mut verdict = Verdict::default();
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    let grants: HashMap<u64, &Grant> = events
        .iter()
        .filter_map(|e| match e {
            Event::Grant(g) => Some((g.id, g)),
            _ => None,
        })
        .collect();
    let life_of = |grant: &Grant| -> Option<&Life> {
        by_key
            .get(grant.key.as_bytes())?
            .iter()
            .map(|i| &lives[*i])
            .find(|life| life.created == grant.token)
    };
    let dump = |prefix: &[u8], around: i64| history_around(history, prefix, around);

    for grant in grants.values() {
        *counts.entry("token").or_default() += 1;
        let Some(life) = life_of(grant) else {
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
        *counts.entry("exclusion").or_default() += 1;
        let revision = grant.admitted;
        if !life.alive_at(revision) {
            verdict.fail(grant.at, format!(
                "exclusion: client {} was granted {} (token {}) at revision {revision}, when its \
                 key did not exist (deleted at {:?})\n{}",
                grant.client,
                grant.key,
                grant.token,
                life.deleted.map(|(d, _)| d),
                dump(&life.prefix, revision)
            ));
            continue;
        }
        let ahead: Vec<&Life> = by_prefix
            .get(life.prefix.as_slice())
            .into_iter()
            .flatten()
            .map(|i| &lives[*i])
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
                    dump(&life.prefix, revision)
                ),
            );
        }
    }

    // Duplicate tokens: a token is one grant of one name, ever. Two grants of one name
    // with equal tokens are one key handed out twice (a name reused while its old key
    // stood) or two keys made in one transaction; either way their fences cannot tell
    // them apart.
    let mut by_token: HashMap<(&[u8], i64), &Grant> = HashMap::new();
    let mut ordered: Vec<&Grant> = grants.values().copied().collect();
    ordered.sort_by_key(|g| (g.at, g.id));
    for grant in ordered {
        let Some(life) = life_of(grant) else { continue };
        *counts.entry("duplicate token").or_default() += 1;
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
                    dump(&life.prefix, grant.token)
                ),
            );
        }
    }

    // A join that finds its own key already there, although no attempt of it went
    // unanswered, met a name its session used before while that name's key stood (a
    // name given back too early): the library refuses the key rather than take an
    // earlier grant's token, but the name should never have been given back.
    for event in events {
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
        *counts.entry("name reuse").or_default() += 1;
        if error.contains("already exists although every attempt") {
            verdict.fail(*at, format!(
                "name reuse: client {client}'s acquisition of {name} found a key of its own name \
                 standing: {error}"
            ));
        }
    }

    // Once `lost()` has resolved, `is_held()` says false for good.
    let mut lost_at: HashMap<u64, Instant> = HashMap::new();
    for event in events {
        match event {
            Event::Lost { id, at, .. } => {
                lost_at.entry(*id).or_insert(*at);
            }
            Event::Held { id, at, held } => {
                let Some(since) = lost_at.get(id) else {
                    continue;
                };
                *counts.entry("held after loss").or_default() += 1;
                if *held {
                    if let Some(grant) = grants.get(id) {
                        verdict.fail(
                            *at,
                            format!(
                                "holding: client {}'s is_held() said true for {} (token {}) {:?} \
                             after its lost() resolved",
                                grant.client,
                                grant.key,
                                grant.token,
                                at.duration_since(*since)
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    // A key outlives its release by at most its lease (a delete that cannot get through
    // leaves the key to its lease) plus retries, plus a revocation of the clients' write
    // permission meanwhile (a refused delete is retried by the sweep once restored).
    for event in events {
        let Event::Released {
            id,
            ended: returned,
            ..
        } = event
        else {
            continue;
        };
        let Some(grant) = grants.get(id) else {
            continue;
        };
        let Some(life) = life_of(grant) else { continue };
        *counts.entry("key after release").or_default() += 1;
        let bound = grant.ttl + RELEASE_SLACK;
        let bound = bound + operator.revoked_slack(*returned, *returned + bound);
        // Never deleted: the leftovers check speaks for a key still there at the end.
        let gone = life.deleted.map_or(ended, |(_, seen)| seen);
        if gone > *returned + bound {
            verdict.fail(
                *returned + bound,
                format!(
                    "release: client {}'s key {} (token {}) was still there {:?} after its release \
                 returned (bound {bound:?})\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    gone.duration_since(*returned),
                    dump(&life.prefix, life.created)
                ),
            );
        }
    }

    for event in events {
        match event {
            Event::Held { id, at, held: true } => {
                let Some(grant) = grants.get(id) else {
                    continue;
                };
                let Some(life) = life_of(grant) else { continue };
                *counts.entry("holding").or_default() += 1;
                if let Some((revision, seen)) = life.deleted {
                    let bound = HeldBound::for_ttl(grant.ttl);
                    if *at > seen + bound {
                        verdict.fail(*at, format!(
                            "holding: client {}'s is_held() said true for {} (token {}) {:?} \
                             after its key was deleted at revision {revision} (bound {bound:?})\n{}",
                            grant.client,
                            grant.key,
                            grant.token,
                            at.duration_since(seen),
                            dump(&life.prefix, revision)
                        ));
                    }
                }
            }
            Event::Lost {
                id,
                at,
                reason: LossReason::KeyDeleted,
            } => {
                let Some(grant) = grants.get(id) else {
                    continue;
                };
                let Some(life) = life_of(grant) else { continue };
                *counts.entry("holding").or_default() += 1;
                // The recorder may hear of a deletion a little after the client does.
                // (3 s of silence before the recorder opens another watch, and its reopen.)
                let heard_late = |seen: Instant| seen > *at + Duration::from_secs(5);
                if life.deleted.is_none_or(|(_, seen)| heard_late(seen)) {
                    verdict.fail(
                        *at,
                        format!(
                            "holding: client {} was told its key {} (token {}) was deleted, before \
                         it was (deleted: {:?})",
                            grant.client,
                            grant.key,
                            grant.token,
                            life.deleted.map(|(d, _)| d)
                        ),
                    );
                }
            }
            Event::Released {
                id,
                started,
                outcome: Outcome::Released,
                ..
            } => {
                let Some(grant) = grants.get(id) else {
                    continue;
                };
                let Some(life) = life_of(grant) else { continue };
                *counts.entry("release").or_default() += 1;
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
                    Some((revision, seen)) if seen + HeldBound::for_ttl(grant.ttl) < *started => {
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
            _ => {}
        }
    }

    // Deletion: a held key that went before its release began went with its lease or by
    // the operator's hand; anything else is a request of someone else's.
    let mut last_put: HashMap<i64, i64> = HashMap::new();
    for event in history {
        if let Some(put) = &event.put {
            let last = last_put.entry(put.lease).or_default();
            *last = (*last).max(event.revision);
        }
    }
    for event in events {
        let Event::Released { id, started, .. } = event else {
            continue;
        };
        let Some(grant) = grants.get(id) else {
            continue;
        };
        let Some(life) = life_of(grant) else { continue };
        let Some((revision, seen)) = life.deleted else {
            continue;
        };
        *counts.entry("deletion").or_default() += 1;
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
                    dump(&life.prefix, revision)
                ),
            );
            continue;
        }
        if operator.explains(life, revision, seen) {
            continue;
        }
        let lease_ended = last_put
            .get(&life.lease)
            .is_none_or(|last| *last < revision);
        if !lease_ended {
            verdict.fail(
                seen,
                format!(
                    "deletion: client {}'s key {} (token {}) was deleted at revision {revision}, \
                 {:?} before its release began, by neither the operator nor its lease's end\n{}",
                    grant.client,
                    grant.key,
                    grant.token,
                    started.duration_since(seen),
                    dump(&life.prefix, revision)
                ),
            );
        }
    }

    // Whose key is whose: every acquisition's id rides in its key's value (the holder
    // record's label, an election's value). A grant's key names that grant's acquisition
    // (never an earlier acquisition's key taken for its own); and a key an acquisition was
    // told was deleted under it (while it waited, or held: `lost()`, or a release that
    // found nothing to delete although every attempt was answered) went by the operator's
    // hand or with its lease, never by a request of another acquisition (a late delete of
    // an earlier key of the same name).
    let accountable = |life: &Life, revision: i64, seen: Instant| {
        !life.deleted_by_client
            && (operator.explains(life, revision, seen)
                || last_put
                    .get(&life.lease)
                    .is_none_or(|last| *last < revision))
    };
    let of_acquisition: HashMap<u64, Vec<&Life>> =
        lives
            .iter()
            .fold(HashMap::new(), |mut map: HashMap<u64, Vec<&Life>>, life| {
                if let Some(id) = acquisition_of(&life.value) {
                    map.entry(id).or_default().push(life);
                }
                map
            });
    for grant in grants.values() {
        let Some(life) = life_of(grant) else { continue };
        *counts.entry("ownership").or_default() += 1;
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
                    dump(&life.prefix, life.created)
                ),
            );
        }
    }
    let mut deleted_under = Vec::new();
    for event in events {
        match event {
            Event::Failed {
                id,
                at,
                key_deleted: true,
                ..
            } => {
                // Its key (made before it was told).
                let life = of_acquisition
                    .get(id)
                    .into_iter()
                    .flatten()
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
            } => {
                if let Some(life) = grants.get(id).and_then(|g| life_of(g)) {
                    deleted_under.push((*at, life, "while it held"));
                }
            }
            Event::Released {
                id,
                started,
                outcome: Outcome::NotHeld,
                ..
            } => {
                if let Some(life) = grants.get(id).and_then(|g| life_of(g)) {
                    deleted_under.push((*started, life, RELEASE_SAID_NOT_HELD));
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
        *counts.entry("foreign delete").or_default() += 1;
        if !accountable(life, revision, seen) {
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
                    dump(&life.prefix, revision)
                ),
            );
        }
    }

    // A wait that concluded its key was gone (from a read, or a watch event, at some
    // revision) was right: the key created at its token existed, and was deleted at or
    // before that revision. (Whoever deleted it afterwards, answered or not: a wait that
    // looked for the wrong key, or misread its queue, shows here.)
    for (key, token, revision) in &clients.seen_gone {
        if !key.starts_with(format!("{namespace}/").as_bytes()) {
            continue;
        }
        *counts.entry("seen gone").or_default() += 1;
        let life = by_key
            .get(key.as_slice())
            .into_iter()
            .flatten()
            .map(|i| &lives[*i])
            .find(|life| life.created == *token);
        let shown = String::from_utf8_lossy(key);
        let wrong = match life {
            None => format!("no key of that name was created at revision {token}"),
            Some(life) if life.alive_at(*revision) => {
                format!("the key created at {token} was alive at that revision")
            }
            Some(_) => continue,
        };
        let seen = life.map(|life| life.created_seen).unwrap_or(ended);
        verdict.fail(
            seen,
            format!(
                "seen gone: a wait concluded at revision {revision} that its key {shown} (token \
                 {token}) was gone, but {wrong}\n{}",
                dump(&prefix_of(key, namespace), *revision)
            ),
        );
    }

    // A key of an acquisition that returned without the lock (busy, timed out, failed)
    // goes soon after the acquisition returned, or after it appeared (a join applied
    // late, after the acquisition gave up and removed what was there): the acquisition's
    // cleanup and the session's sweep remove it, or its lease takes it; never a key
    // nobody owns left under a lease that is renewed.
    let mut returned: HashMap<u64, Instant> = HashMap::new();
    for event in events {
        match event {
            Event::Missed { id, at } | Event::Failed { id, at, .. } => {
                returned.insert(*id, *at);
            }
            _ => {}
        }
    }
    for (id, at) in &returned {
        let Some(lives) = of_acquisition.get(id) else {
            continue;
        };
        for life in lives {
            *counts.entry("key left").or_default() += 1;
            let from = (*at).max(life.created_seen);
            let bound = LONGEST_TTL + RELEASE_SLACK;
            let bound = bound + operator.revoked_slack(from, from + bound);
            let gone = life.deleted.map_or(ended, |(_, seen)| seen);
            if gone > from + bound {
                verdict.fail(
                    from + bound,
                    format!(
                        "key left: key {} (created {}) of acquisition {id}, which returned \
                 without the lock, was still there {:?} after (bound {bound:?})\n{}",
                        String::from_utf8_lossy(&life.key),
                        life.created,
                        gone.duration_since(from),
                        dump(&life.prefix, life.created)
                    ),
                );
            }
        }
    }

    // Progress: every key admitted by the history is granted, or gone, soon.
    let granted: HashMap<(&[u8], i64), &Grant> = grants
        .values()
        .map(|g| ((g.key.as_bytes(), g.token), *g))
        .collect();
    let seen_at = revision_times(history);
    for life in &lives {
        let Some(peers) = by_prefix.get(life.prefix.as_slice()) else {
            continue;
        };
        *counts.entry("progress").or_default() += 1;
        let Some(admitted) = first_admission(life, peers, &lives) else {
            continue;
        };
        let since = seen_at.get(&admitted).copied().unwrap_or(life.created_seen);
        let until = match granted.get(&(life.key.as_slice(), life.created)) {
            // Granted: when the client was told.
            Some(grant) => grant.at,
            None => life.deleted.map_or(ended, |(_, seen)| seen),
        };
        let bound = STALL_BOUND + operator.revoked_slack(since, since + STALL_BOUND);
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
                    dump(&life.prefix, admitted)
                ),
            );
        }
    }

    *counts.entry("leftovers").or_default() += 1;
    for key in left {
        verdict.fail(
            ended,
            format!("leftovers: key {key} was still there after the run settled"),
        );
    }

    let mut checked: Vec<(&'static str, usize)> = counts.into_iter().collect();
    checked.sort();
    verdict.checked = checked;
    verdict
}

/// The soak acquisition whose key holds `value` (`workload::label`: the end of its holder
/// record, or an election's whole value).
fn acquisition_of(value: &[u8]) -> Option<u64> {
    const LABEL: &[u8] = b"soak-acquisition-";
    let at = value
        .windows(LABEL.len())
        .rposition(|window| window == LABEL)?;
    // Only where a label or a value starts: a record's `label=`, or the whole value.
    if at != 0 && value[at - 1] != b'=' {
        return None;
    }
    std::str::from_utf8(&value[at + LABEL.len()..])
        .ok()?
        .parse()
        .ok()
}

/// How a release that answered NotHeld (believing itself held) is named among the keys
/// deleted under their acquisitions.
const RELEASE_SAID_NOT_HELD: &str = "before its release deleted it";

/// Every key's life under `namespace`, from the history; `by_clients` are the deletions
/// the clients made.
fn lives(history: &[Observed], namespace: &str, by_clients: &HashSet<(Vec<u8>, i64)>) -> Vec<Life> {
    let mut lives: Vec<Life> = Vec::new();
    let mut open: HashMap<Vec<u8>, usize> = HashMap::new();
    for event in history {
        let prefix = prefix_of(&event.key, namespace);
        if prefix.len() == event.key.len() {
            // Not a lock's key (the harness's end marker).
            continue;
        }
        match &event.put {
            Some(put) => {
                if let Some(i) = open.get(&event.key) {
                    // An update of a live key (a leader's proclaim): same life.
                    lives[*i].value.clone_from(&put.value);
                    continue;
                }
                open.insert(event.key.clone(), lives.len());
                lives.push(Life {
                    prefix,
                    key: event.key.clone(),
                    created: put.create_revision,
                    created_seen: event.seen,
                    value: put.value.clone(),
                    lease: put.lease,
                    deleted: None,
                    deleted_by_client: false,
                });
            }
            None => {
                if let Some(i) = open.remove(&event.key) {
                    lives[i].deleted = Some((event.revision, event.seen));
                    lives[i].deleted_by_client =
                        by_clients.contains(&(event.key.clone(), event.revision));
                }
            }
        }
    }
    lives
}

/// The lock prefix of a key `<namespace>/<name>/<rest>`.
fn prefix_of(key: &[u8], namespace: &str) -> Vec<u8> {
    let skip = namespace.len() + 1;
    let rest = key.get(skip..).unwrap_or_default();
    let end = rest
        .iter()
        .position(|b| *b == b'/')
        .map_or(key.len(), |p| skip + p + 1);
    key[..end].to_vec()
}

/// When the recorder first saw each revision.
fn revision_times(history: &[Observed]) -> HashMap<i64, Instant> {
    let mut times = HashMap::new();
    for event in history {
        times.entry(event.revision).or_insert(event.seen);
    }
    times
}

/// The first revision at which `life`'s key is admitted by the keys ahead of it.
fn first_admission(life: &Life, peers: &[usize], lives: &[Life]) -> Option<i64> {
    let ahead: Vec<&Life> = peers
        .iter()
        .map(|i| &lives[*i])
        .filter(|other| other.created < life.created)
        .collect();
    let mut moments: BTreeSet<i64> = ahead
        .iter()
        .filter_map(|other| other.deleted.map(|(d, _)| d))
        .filter(|d| *d > life.created)
        .collect();
    moments.insert(life.created);
    let mine = share(&life.value);
    moments.into_iter().find(|revision| {
        life.alive_at(*revision) && {
            let shares: Vec<Share> = ahead
                .iter()
                .filter(|other| other.alive_at(*revision))
                .map(|other| share(&other.value))
                .collect();
            admits(mine, &shares)
        }
    })
}

/// The history of `prefix` around `revision`, for a violation's report.
fn history_around(history: &[Observed], prefix: &[u8], revision: i64) -> String {
    let mut out = String::from("  history of the lock around it:\n");
    let relevant: Vec<&Observed> = history
        .iter()
        .filter(|e| e.key.starts_with(prefix))
        .collect();
    let at = relevant
        .iter()
        .position(|e| e.revision >= revision)
        .unwrap_or(relevant.len());
    for event in &relevant[at.saturating_sub(12)..(at + 8).min(relevant.len())] {
        let what = match &event.put {
            Some(put) => format!(
                "put (value {:?}, lease {:x})",
                String::from_utf8_lossy(&put.value),
                put.lease
            ),
            None => "delete".to_owned(),
        };
        let _ = writeln!(
            out,
            "    {} {} {what}",
            event.revision,
            String::from_utf8_lossy(&event.key)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "soak";

    struct Story {
        start: Instant,
        history: Vec<Observed>,
        events: Vec<Event>,
        /// Deletions the clients' own requests made.
        clients: Recorded,
    }

    impl Story {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                history: Vec::new(),
                events: Vec::new(),
                clients: Recorded::default(),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.start + Duration::from_millis(ms)
        }

        fn put(&mut self, revision: i64, key: &str, value: &str, ms: u64) {
            self.history.push(Observed {
                revision,
                key: key.as_bytes().to_vec(),
                put: Some(Put {
                    create_revision: revision,
                    value: value.as_bytes().to_vec(),
                    lease: 1,
                }),
                seen: self.at(ms),
            });
        }

        /// A deletion by a request of the clients.
        fn client_delete(&mut self, revision: i64, key: &str, ms: u64) {
            self.delete(revision, key, ms);
            self.clients
                .own_deletes
                .insert((key.as_bytes().to_vec(), revision));
        }

        fn delete(&mut self, revision: i64, key: &str, ms: u64) {
            self.history.push(Observed {
                revision,
                key: key.as_bytes().to_vec(),
                put: None,
                seen: self.at(ms),
            });
        }

        fn grant(&mut self, id: u64, key: &str, token: i64, admitted: i64, ms: u64) {
            self.events.push(Event::Grant(Grant {
                id,
                client: 0,
                key: key.to_owned(),
                token,
                admitted,
                ttl: Duration::from_secs(2),
                at: self.at(ms),
            }));
        }

        fn check(&self, ended_ms: u64) -> Verdict {
            check(
                &self.history,
                &self.events,
                &[],
                self.at(ended_ms),
                NS,
                &Default::default(),
                &self.clients,
            )
        }

        fn released(&mut self, id: u64, ms: u64) {
            self.events.push(Event::Released {
                id,
                started: self.at(ms),
                ended: self.at(ms),
                outcome: Outcome::Released,
            });
        }
    }

    fn kinds(verdict: &Verdict) -> Vec<&str> {
        verdict
            .violations
            .iter()
            .map(|v| v.split(':').next().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_clean_handoff_passes() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/b-0", "", 2);
        s.delete(4, "soak/x/a-0", 3);
        s.grant(2, "soak/x/b-0", 3, 4, 4);
        s.delete(5, "soak/x/b-0", 5);
        let verdict = s.check(10);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn two_holders_of_one_lock_are_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/b-0", "", 2);
        // b says it was admitted at 3, while a's key lives.
        s.grant(2, "soak/x/b-0", 3, 3, 3);
        assert_eq!(kinds(&s.check(10)), ["exclusion"]);
    }

    #[test]
    fn a_grant_on_a_revision_that_deleted_its_own_key_is_caught() {
        // The prefix delete: holder's and waiter's keys go at 4; the waiter says 4.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.put(3, "soak/x/a-1", "", 1);
        s.delete(4, "soak/x/a-0", 2);
        s.delete(4, "soak/x/a-1", 2);
        s.grant(1, "soak/x/a-1", 3, 4, 3);
        assert_eq!(kinds(&s.check(10)), ["exclusion"]);
    }

    #[test]
    fn readers_share_and_permits_count() {
        let mut s = Story::new();
        s.put(2, "soak/x/a", "fencelock:read", 0);
        s.put(3, "soak/x/b", "fencelock:read", 0);
        s.grant(1, "soak/x/a", 2, 2, 1);
        s.grant(2, "soak/x/b", 3, 3, 1);
        s.put(4, "soak/y/a", "fencelock:permit/2", 0);
        s.put(5, "soak/y/b", "fencelock:permit/2", 0);
        s.put(6, "soak/y/c", "fencelock:permit/2", 0);
        s.grant(3, "soak/y/a", 4, 4, 1);
        s.grant(4, "soak/y/b", 5, 5, 1);
        s.grant(5, "soak/y/c", 6, 6, 1); // a third permit of two
        let verdict = s.check(1);
        assert_eq!(kinds(&verdict), ["exclusion"], "{:?}", verdict.violations);
    }

    #[test]
    fn a_wrong_token_is_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 7, 7, 1);
        assert_eq!(kinds(&s.check(1)), ["token"]);
    }

    #[test]
    fn holding_long_after_the_key_went_is_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.delete(3, "soak/x/a-0", 100);
        s.events.push(Event::Held {
            id: 1,
            at: s.at(1000),
            held: true,
        });
        s.events.push(Event::Held {
            id: 1,
            at: s.at(100 + 2000 + 1500 + 1),
            held: true,
        });
        assert_eq!(kinds(&s.check(5000)), ["holding"]);
    }

    #[test]
    fn a_lost_wakeup_and_a_key_nobody_holds_are_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/b-0", "", 2);
        s.delete(4, "soak/x/a-0", 10);
        // b's waiter hears only 7 s later.
        s.grant(2, "soak/x/b-0", 3, 4, 7010);
        s.delete(5, "soak/x/b-0", 7020);
        // An orphan on another lock: created, admitted at once, never held, never gone.
        s.put(6, "soak/y/c-0", "", 7030);
        let verdict = s.check(15_000);
        assert_eq!(
            kinds(&verdict),
            ["progress", "progress"],
            "{:?}",
            verdict.violations
        );
    }

    #[test]
    fn keys_left_after_the_run_are_reported() {
        let s = Story::new();
        let verdict = check(
            &s.history,
            &s.events,
            &["soak/x/a-0".into()],
            s.at(0),
            NS,
            &Default::default(),
            &s.clients,
        );
        assert_eq!(kinds(&verdict), ["leftovers"]);
    }

    #[test]
    fn a_held_key_deleted_by_nobody_accountable_is_caught() {
        // A late delete of another acquisition removes a's key; b is rightly granted at
        // that revision, and a is told in time: only the deletion itself gives it away.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/b-0", "", 2);
        s.delete(5, "soak/x/a-0", 10);
        s.grant(2, "soak/x/b-0", 3, 5, 11);
        // The lease of a's key lives on: a later key of the same lease.
        s.put(6, "soak/y/a-1", "", 20);
        s.released(1, 300);
        s.delete(7, "soak/x/b-0", 400);
        s.released(2, 390);
        assert_eq!(kinds(&s.check(1000)), ["deletion"]);
        // By the operator's hand: no violation.
        let operator = Operator {
            revisions: vec![(5, Target::Key(b"soak/x/a-0".to_vec()))],
            unanswered: Vec::new(),
            revoked: Vec::new(),
        };
        let verdict = check(
            &s.history,
            &s.events,
            &[],
            s.at(1000),
            NS,
            &operator,
            &s.clients,
        );
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        // An operator request without an answer, in flight when the key went, explains
        // it only if it could delete that key.
        let in_flight = |target| Operator {
            unanswered: vec![(s.at(5), s.at(8), target)],
            ..Default::default()
        };
        for (target, explained) in [
            (Target::Key(b"soak/x/b-0".to_vec()), false),
            (Target::Prefix(b"soak/y/".to_vec()), false),
            (Target::Lease(2), false),
            (Target::Key(b"soak/x/a-0".to_vec()), true),
            (Target::Prefix(b"soak/x/".to_vec()), true),
            (Target::Lease(1), true),
        ] {
            let what = format!("{target:?}");
            let verdict = check(
                &s.history,
                &s.events,
                &[],
                s.at(1000),
                NS,
                &in_flight(target),
                &s.clients,
            );
            let expected: &[&str] = if explained { &[] } else { &["deletion"] };
            assert_eq!(kinds(&verdict), expected, "{what}");
        }
    }

    #[test]
    fn a_prefix_is_the_namespace_and_the_lock_name() {
        assert_eq!(prefix_of(b"soak/x/0a-1", NS), b"soak/x/");
        assert_eq!(prefix_of(b"soak/long-name/k", NS), b"soak/long-name/");
    }

    #[test]
    fn one_key_granted_twice_is_a_duplicate_token() {
        // A name given back while its key stood: the next acquisition finds the old key
        // and is granted with its token again.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.released(1, 10);
        s.grant(2, "soak/x/a-0", 2, 4, 20);
        s.released(2, 30);
        s.delete(5, "soak/x/a-0", 31);
        assert!(kinds(&s.check(1000)).contains(&"duplicate token"));
    }

    #[test]
    fn two_keys_of_one_name_made_in_one_transaction_are_caught() {
        // Two joins of one name batched: one create revision, and each holds.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.put(2, "soak/x/a-1", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.grant(2, "soak/x/a-1", 2, 2, 1);
        s.delete(3, "soak/x/a-0", 5);
        s.delete(4, "soak/x/a-1", 5);
        let verdict = s.check(1000);
        let found = kinds(&verdict);
        assert!(found.contains(&"duplicate token"), "{found:?}");
        assert!(found.contains(&"exclusion"), "{found:?}");
    }

    #[test]
    fn is_held_after_lost_is_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.delete(3, "soak/x/a-0", 100);
        s.events.push(Event::Lost {
            id: 1,
            at: s.at(110),
            reason: LossReason::KeyDeleted,
        });
        s.events.push(Event::Held {
            id: 1,
            at: s.at(160),
            held: true,
        });
        assert_eq!(kinds(&s.check(1000)), ["holding"]);
    }

    #[test]
    fn a_key_long_after_its_release_is_caught_unless_writes_were_revoked() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.released(1, 10);
        // TTL 2 s + 5 s later.
        s.delete(3, "soak/x/a-0", 10 + 7000 + 1);
        assert_eq!(kinds(&s.check(9000)), ["release"]);
        let operator = Operator {
            revoked: vec![(s.at(0), s.at(2000))],
            ..Default::default()
        };
        let verdict = check(
            &s.history,
            &s.events,
            &[],
            s.at(9000),
            NS,
            &operator,
            &s.clients,
        );
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    fn record(id: u64) -> String {
        format!(
            "\nfencelock-holder/1 host=h pid=1 since=1 ttl=2000 label={}",
            super::super::workload::label(id)
        )
    }

    #[test]
    fn an_acquisition_is_found_by_its_label() {
        assert_eq!(acquisition_of(record(17).as_bytes()), Some(17));
        assert_eq!(acquisition_of(b"soak-acquisition-4"), Some(4));
        assert_eq!(acquisition_of(b"fencelock:read"), None);
        // Only a label or a whole value counts.
        assert_eq!(acquisition_of(b"xsoak-acquisition-4"), None);
    }

    #[test]
    fn a_waiters_key_deleted_by_another_acquisitions_request_is_caught() {
        let mut s = Story::new();
        // Acquisition 1 holds; acquisition 2 of the same session (lease 1) waits behind
        // it, and its key goes at revision 4 by nobody's account (the lease is used
        // after, no operator): a late delete of an earlier key of that name.
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/a-1", &record(2), 2);
        s.delete(4, "soak/x/a-1", 3);
        s.put(5, "soak/y/a-0", &record(3), 4);
        s.events.push(Event::Failed {
            id: 2,
            client: 0,
            name: "x".into(),
            at: s.at(5),
            error: "lease lost on lock \"x\": key deleted".into(),
            key_deleted: true,
        });
        s.delete(6, "soak/x/a-0", 6);
        s.released(1, 6);
        s.delete(7, "soak/y/a-0", 7);
        let verdict = s.check(10);
        assert_eq!(
            kinds(&verdict),
            ["foreign delete"],
            "{:?}",
            verdict.violations
        );

        // The same deletion by the operator's hand is no violation.
        let operator = Operator {
            revisions: vec![(4, Target::Prefix(b"soak/x/".to_vec()))],
            ..Default::default()
        };
        let verdict = check(
            &s.history,
            &s.events,
            &[],
            s.at(10),
            NS,
            &operator,
            &s.clients,
        );
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_grant_of_another_acquisitions_key_is_caught() {
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(2, "soak/x/a-0", 2, 2, 1);
        s.delete(3, "soak/x/a-0", 3);
        s.released(2, 3);
        let verdict = s.check(10);
        assert_eq!(kinds(&verdict), ["ownership"], "{:?}", verdict.violations);
    }

    #[test]
    fn a_late_key_of_an_acquisition_that_gave_up_is_caught() {
        let mut s = Story::new();
        // Acquisition 5 timed out at 1 s; a join of it applied late made its key at 2 s,
        // and nothing removed it until 20 s.
        s.events.push(Event::Missed {
            id: 5,
            at: s.at(1000),
        });
        s.put(2, "soak/x/a-3", &record(5), 2000);
        s.delete(3, "soak/x/a-3", 20_000);
        let verdict = s.check(30_000);
        // (At the head of its queue, it also stalled the lock.)
        assert_eq!(
            kinds(&verdict),
            ["key left", "progress"],
            "{:?}",
            verdict.violations
        );

        // Swept a second after it appeared: fine.
        let mut s = Story::new();
        s.events.push(Event::Missed {
            id: 5,
            at: s.at(1000),
        });
        s.put(2, "soak/x/a-3", &record(5), 2000);
        s.delete(3, "soak/x/a-3", 3000);
        let verdict = s.check(30_000);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_waiters_key_its_own_client_deleted_after_it_was_told_is_caught() {
        // Acquisition 2 waits behind 1 and is told its key was deleted; the key was still
        // there, and its own cleanup deleted it after. Its session is retired (no put
        // uses lease 1 afterwards), which would pass the deletion off as the lease's end.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/x/a-1", &record(2), 2);
        s.events.push(Event::Failed {
            id: 2,
            client: 0,
            name: "x".into(),
            at: s.at(5),
            error: "lease lost on lock \"x\": key deleted".into(),
            key_deleted: true,
        });
        s.client_delete(4, "soak/x/a-1", 5);
        s.client_delete(5, "soak/x/a-0", 6);
        s.released(1, 6);
        let verdict = s.check(10);
        assert_eq!(
            kinds(&verdict),
            ["foreign delete"],
            "{:?}",
            verdict.violations
        );
        assert!(verdict.violations[0].contains("by a request of the clients"));

        // Deleted with its lease (no request of the clients): no violation.
        s.clients.own_deletes.remove(&(b"soak/x/a-1".to_vec(), 4));
        let verdict = s.check(10);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_held_key_deleted_by_a_clients_request_before_its_release_is_caught() {
        // Even while the operator's delete of some key was unanswered (which excuses
        // deletions seen meanwhile), a deletion the clients' own request made is theirs.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.client_delete(3, "soak/x/a-0", 100);
        s.released(1, 200);
        let operator = Operator {
            unanswered: vec![(s.at(50), s.at(150), Target::Key(b"soak/x/a-0".to_vec()))],
            ..Default::default()
        };
        let verdict = check(
            &s.history,
            &s.events,
            &[],
            s.at(1000),
            NS,
            &operator,
            &s.clients,
        );
        assert_eq!(kinds(&verdict), ["deletion"], "{:?}", verdict.violations);

        // The release's own delete (seen after the release began) is fine.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.released(1, 100);
        s.client_delete(3, "soak/x/a-0", 110);
        let verdict = s.check(1000);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_wait_that_saw_a_live_key_gone_is_caught() {
        // Acquisition 2's key (created at 3) is alive when its wait concludes, at
        // revision 4, that it is gone; or the wait looked for a key created at 4, which
        // its name never had (a token that is not its key's create revision).
        for (token, at) in [(3, 4), (4, 4)] {
            let mut s = Story::new();
            s.put(2, "soak/x/a-0", &record(1), 0);
            s.grant(1, "soak/x/a-0", 2, 2, 1);
            s.put(3, "soak/x/a-1", &record(2), 2);
            s.put(4, "soak/y/a-0", &record(3), 3);
            s.clients
                .seen_gone
                .push((b"soak/x/a-1".to_vec(), token, at));
            s.delete(5, "soak/x/a-1", 5);
            s.delete(6, "soak/x/a-0", 6);
            s.released(1, 6);
            s.delete(7, "soak/y/a-0", 7);
            let verdict = s.check(10);
            assert_eq!(
                kinds(&verdict),
                ["seen gone"],
                "token {token}: {:?}",
                verdict.violations
            );
        }
        // Deleted at 4 and seen gone at 4 (or later): right.
        let mut s = Story::new();
        s.put(3, "soak/x/a-1", &record(2), 2);
        s.delete(4, "soak/x/a-1", 3);
        s.clients.seen_gone.push((b"soak/x/a-1".to_vec(), 3, 4));
        s.clients.seen_gone.push((b"soak/x/a-1".to_vec(), 3, 9));
        let verdict = s.check(10);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn a_release_that_found_itself_lost_may_delete_its_key() {
        // The release began believing itself held, found its lease's local deadline
        // passed, answered NotHeld, and its own delete removed the key: no violation.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", &record(1), 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.events.push(Event::Released {
            id: 1,
            started: s.at(100),
            ended: s.at(120),
            outcome: Outcome::NotHeld,
        });
        s.client_delete(3, "soak/x/a-0", 110);
        let verdict = s.check(1000);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    }

    #[test]
    fn an_operator_delete_explains_only_the_keys_it_could_delete() {
        // The operator's delete of b-0 was applied at revision 5, and a-0 went at 5 too,
        // by a request nobody accounts for: b-0's delete does not explain it.
        let mut s = Story::new();
        s.put(2, "soak/x/a-0", "", 0);
        s.grant(1, "soak/x/a-0", 2, 2, 1);
        s.put(3, "soak/z/b-0", "", 2);
        s.delete(5, "soak/x/a-0", 10);
        s.delete(5, "soak/z/b-0", 10);
        s.put(6, "soak/y/a-1", "", 20);
        s.released(1, 300);
        let operator = Operator {
            revisions: vec![(5, Target::Key(b"soak/z/b-0".to_vec()))],
            ..Default::default()
        };
        let verdict = check(
            &s.history,
            &s.events,
            &[],
            s.at(1000),
            NS,
            &operator,
            &s.clients,
        );
        assert_eq!(kinds(&verdict), ["deletion"], "{:?}", verdict.violations);
    }
}
