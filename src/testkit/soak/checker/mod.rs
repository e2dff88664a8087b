//! The soak's independent checker: the truth is etcd's own history (every put and delete
//! under the namespace, with its revision, as a watch from revision 1 saw it), and every
//! claim a client made is checked against it. Nothing here trusts the library: the rule
//! for who may hold beside whom is written again from the design, and a grant is checked
//! at the revision the client says it was decided at.
//!
//! Checks, one file per group:
//!
//! - `grants.rs`: **token**: a grant's token is the create revision of a key of that
//!   name; **exclusion**: at the revision a grant was decided, its key was alive and the
//!   keys ahead of it (alive, created earlier) admitted it: none for a lock, a writer or a
//!   leader; only readers for a reader; fewer than N permits of the same N for a permit;
//!   **duplicate token**: no two grants of one name share a token; **ownership**: a
//!   grant's key is its own acquisition's (each key's value names its acquisition);
//! - `holding.rs`: **holding**: `is_held()` never says true longer than [`HeldBound`]
//!   after the key was deleted, nor at all once `lost()` resolved, and a lost guard's
//!   `lost()` names a key deletion only if there was one; **release**: a release reported
//!   `Released` left no key behind, and no key outlives its release by more than its
//!   lease and retries;
//! - `deletions.rs`: **deletion**: a held key deleted before its release began was
//!   deleted by the operator (the nemesis) or with its lease (no put used the lease
//!   afterwards), never by a request nobody accounts for (a late delete of another
//!   acquisition), and never by a request the clients' answers say was theirs
//!   (`etcd::observed`); **foreign delete**: a key its acquisition was told was deleted
//!   went by the operator's hand or with its lease, not by any request of the clients
//!   (its own cleanup included: then it was not gone when it was told); **seen gone**: a
//!   wait that concluded its key was gone was right;
//! - `keys.rs`: **name reuse**: no acquisition finds its own key's name standing; **key
//!   left**: a key of an acquisition that returned without the lock goes soon;
//!   **leftovers**: after the run and a settling period no key is left;
//! - `progress.rs`: **progress**: a key admitted by the history is granted (or gone)
//!   within [`STALL_BOUND`]: a waiter that stays in line although the keys ahead left is
//!   a lost wakeup, and a key nobody holds or waits on (a late join) blocks the lock. A
//!   key of a `lock_all` is granted only with the other keys of its transaction: its
//!   bound runs from when every one of them is admitted (or, if that never happens, from
//!   when the first of them went);
//! - `multi.rs`: several locks at once (`lock_all`): **multi join**: every attempt puts
//!   one key per name in one transaction (one create revision); **multi grant**: the
//!   grant holds every name, with one token, that revision; **multi retry**: a join
//!   refused because its keys were already there found keys an earlier attempt of its own
//!   had put.
//!
//! A `lock_all` acquisition is journalled as [`Event::Multi`] with its names, then a
//! [`Grant`] per lock (one acquisition id): every rule above that speaks of a grant's key
//! holds for each of its keys (one holder of its name among the others, single or not).

mod deletions;
mod grants;
mod holding;
mod keys;
mod model;
mod multi;
mod progress;
mod queue;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::etcd::Recorded;
pub(crate) use model::{Event, Grant, Observed, Operator, Outcome, Put, Target};
use model::{Life, history_around, lives};

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

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Each check run, by name, and how many times.
    pub(crate) checked: Vec<(&'static str, usize)>,
    /// Every violation, with the history around it.
    pub(crate) violations: Vec<String>,
    /// When the earliest violation happened (as near as the checker can tell).
    pub(crate) first_at: Option<Instant>,
    /// The checks made so far (`checked` once all are done).
    counts: HashMap<&'static str, usize>,
}

impl Verdict {
    fn fail(&mut self, at: Instant, violation: String) {
        self.first_at = Some(self.first_at.map_or(at, |first| first.min(at)));
        self.violations.push(violation);
    }

    /// One more check of kind `what` made.
    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }
}

/// Everything the rules look at, indexed once.
struct Ctx<'a> {
    history: &'a [Observed],
    events: &'a [Event],
    namespace: &'a str,
    /// When the run began: times in reports count from it, as the fault log's do.
    started: Instant,
    ended: Instant,
    operator: &'a Operator,
    clients: &'a Recorded,
    lives: &'a [Life],
    /// Every life of each key.
    by_key: HashMap<&'a [u8], Vec<usize>>,
    /// Every life of each lock (its prefix).
    by_prefix: HashMap<&'a [u8], Vec<usize>>,
    /// Every grant, by its acquisition (a `lock_all`'s: one per lock).
    grants: HashMap<u64, Vec<&'a Grant>>,
    /// The names of every acquisition of several locks at once.
    multi: HashMap<u64, &'a [String]>,
    /// The keys each acquisition made (their values name it).
    of_acquisition: HashMap<u64, Vec<&'a Life>>,
    /// The last revision at which each lease was used for a put.
    last_put: HashMap<i64, i64>,
    /// When each acquisition returned without the lock (a miss or a failure).
    returned: HashMap<u64, Instant>,
}

impl<'a> Ctx<'a> {
    /// Every grant of every acquisition.
    fn every_grant(&self) -> impl Iterator<Item = &'a Grant> + '_ {
        self.grants.values().flatten().copied()
    }

    /// The grants of acquisition `id` (one lock each; none if it was not granted).
    fn grants_of(&self, id: u64) -> &[&'a Grant] {
        self.grants.get(&id).map_or(&[], Vec::as_slice)
    }

    /// The grants of acquisition `id` whose key is `key` (all of them for `None`: a
    /// single lock's one grant).
    fn grants_with_key(&self, id: u64, key: &Option<String>) -> Vec<&'a Grant> {
        self.grants_of(id)
            .iter()
            .copied()
            .filter(|grant| key.as_ref().is_none_or(|key| grant.key == *key))
            .collect()
    }

    /// The prefix of lock `name`'s keys.
    fn prefix(&self, name: &str) -> Vec<u8> {
        format!("{}/{name}/", self.namespace).into_bytes()
    }

    /// The life of `grant`'s key: the key created at its token.
    fn life_of(&self, grant: &Grant) -> Option<&'a Life> {
        let lives = self.lives;
        self.by_key
            .get(grant.key.as_bytes())?
            .iter()
            .map(|i| &lives[*i])
            .find(|life| life.created == grant.token)
    }

    /// The history of `prefix` around `around`, for a violation's report.
    fn dump(&self, prefix: &[u8], around: i64) -> String {
        history_around(self.history, prefix, around)
    }

    /// The history of `life`'s lock around `around`, and its acquisition's story.
    fn report(&self, life: &Life, around: i64) -> String {
        format!("{}{}", self.dump(&life.prefix, around), self.story(life))
    }

    /// What the journal says of the acquisition whose key `life` is, for a violation's
    /// report: when it began and what it asked for, and what it was told, each with its
    /// time from the run's start (as the fault log's).
    fn story(&self, life: &Life) -> String {
        let Some(id) = model::acquisition_of(&life.value) else {
            return "  its acquisition: none named in its value\n".to_owned();
        };
        let secs = |at: &Instant| at.saturating_duration_since(self.started).as_secs_f64();
        let mut out = format!("  its acquisition {id}:\n");
        for event in self.events {
            let line = match event {
                Event::Started {
                    id: of,
                    client,
                    at,
                    what,
                } if *of == id => format!("{:>8.3}s client {client} began: {what}", secs(at)),
                Event::Grant(grant) if grant.id == id => format!(
                    "{:>8.3}s granted {} (token {}, admitted at {})",
                    secs(&grant.at),
                    grant.key,
                    grant.token,
                    grant.admitted
                ),
                Event::Missed { id: of, at } if *of == id => {
                    format!("{:>8.3}s returned without the lock", secs(at))
                }
                Event::Failed {
                    id: of, at, error, ..
                } if *of == id => format!("{:>8.3}s failed: {error}", secs(at)),
                Event::Lost {
                    id: of, at, reason, ..
                } if *of == id => format!("{:>8.3}s told it lost the lock: {reason:?}", secs(at)),
                Event::Released {
                    id: of,
                    started,
                    ended,
                    outcome,
                } if *of == id => format!(
                    "{:>8.3}s released ({outcome:?}, returned at {:.3}s)",
                    secs(started),
                    secs(ended)
                ),
                _ => continue,
            };
            out.push_str("    ");
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str(&format!(
            "  its key: created at revision {} (seen {:.3}s), {}\n",
            life.created,
            secs(&life.created_seen),
            life.deleted
                .map_or("never deleted".to_owned(), |(revision, at)| format!(
                    "deleted at revision {revision} (seen {:.3}s)",
                    secs(&at)
                ))
        ));
        out
    }

    /// Whether `life`'s lease was used by no put at or after `revision` (a deletion then
    /// may have been its end).
    fn lease_ended(&self, life: &Life, revision: i64) -> bool {
        self.last_put
            .get(&life.lease)
            .is_none_or(|last| *last < revision)
    }

    /// Whether the deletion of `life`'s key at `revision` (seen at `seen`) is accounted
    /// for: not a request of the clients, and by the operator's hand or with its lease.
    fn accountable(&self, life: &Life, revision: i64, seen: Instant) -> bool {
        !life.deleted_by_client
            && (self.operator.explains(life, revision, seen) || self.lease_ended(life, revision))
    }
}

/// Checks `events` against `history`; `left` are the keys found after the run settled,
/// `run` when the workload began and stopped, `operator` what the nemesis deleted, `clients` what
/// the clients recorded themselves: every deletion their own answered requests made, and
/// when their waits saw their keys gone.
pub(crate) fn check(
    history: &[Observed],
    events: &[Event],
    left: &[String],
    run: std::ops::Range<Instant>,
    namespace: &str,
    operator: &Operator,
    clients: &Recorded,
) -> Verdict {
    let lives = lives(history, namespace, &clients.own_deletes);
    let index = |of: fn(&Life) -> &[u8]| {
        lives.iter().enumerate().fold(
            HashMap::new(),
            |mut map: HashMap<&[u8], Vec<usize>>, (i, life)| {
                map.entry(of(life)).or_default().push(i);
                map
            },
        )
    };
    let mut last_put: HashMap<i64, i64> = HashMap::new();
    for event in history {
        if let Some(put) = &event.put {
            let last = last_put.entry(put.lease).or_default();
            *last = (*last).max(event.revision);
        }
    }
    let ctx = Ctx {
        history,
        events,
        namespace,
        started: run.start,
        ended: run.end,
        operator,
        clients,
        lives: &lives,
        by_key: index(|life| &life.key),
        by_prefix: index(|life| &life.prefix),
        grants: events.iter().fold(
            HashMap::new(),
            |mut map: HashMap<u64, Vec<&Grant>>, event| {
                if let Event::Grant(grant) = event {
                    map.entry(grant.id).or_default().push(grant);
                }
                map
            },
        ),
        multi: events
            .iter()
            .filter_map(|event| match event {
                Event::Multi { id, names } => Some((*id, names.as_slice())),
                _ => None,
            })
            .collect(),
        of_acquisition: lives.iter().fold(
            HashMap::new(),
            |mut map: HashMap<u64, Vec<&Life>>, life| {
                if let Some(id) = model::acquisition_of(&life.value) {
                    map.entry(id).or_default().push(life);
                }
                map
            },
        ),
        last_put,
        returned: events
            .iter()
            .filter_map(|event| match event {
                Event::Missed { id, at } | Event::Failed { id, at, .. } => Some((*id, *at)),
                _ => None,
            })
            .collect(),
    };
    let mut verdict = Verdict::default();
    grants::token_and_exclusion(&ctx, &mut verdict);
    grants::duplicate_tokens(&ctx, &mut verdict);
    multi::joins_and_grants(&ctx, &mut verdict);
    keys::name_reuse(&ctx, &mut verdict);
    holding::after_loss(&ctx, &mut verdict);
    holding::key_after_release(&ctx, &mut verdict);
    holding::claims(&ctx, &mut verdict);
    deletions::before_release(&ctx, &mut verdict);
    grants::ownership(&ctx, &mut verdict);
    deletions::foreign(&ctx, &mut verdict);
    deletions::seen_gone(&ctx, &mut verdict);
    keys::key_left(&ctx, &mut verdict);
    progress::progress(&ctx, &mut verdict);
    keys::leftovers(left, run.end, &mut verdict);

    let mut checked: Vec<(&'static str, usize)> =
        std::mem::take(&mut verdict.counts).into_iter().collect();
    checked.sort();
    verdict.checked = checked;
    verdict
}
