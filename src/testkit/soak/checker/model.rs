//! What the checker reads: etcd's history (every put and delete under the namespace, as
//! the recorder saw it), what the clients were told (the workload's journal) and what the
//! operator did; and each key's life, rebuilt from the history.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use super::REVOKED_SLACK;
use crate::LossReason;

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
    /// Acquisition `id` of client `client` began at `at`: `what` it asked for (the
    /// primitive, its names, a try or a wait and its timeout), for violations' reports.
    Started {
        id: u64,
        client: usize,
        at: Instant,
        what: String,
    },
    /// A grant of one lock; a `lock_all` is told of every lock at once, a `Grant` each
    /// (one acquisition id).
    Grant(Grant),
    /// Acquisition `id` takes several locks at once (`lock_all`, `try_lock_all`): these
    /// names (in the order given). Journalled before it starts.
    Multi { id: u64, names: Vec<String> },
    /// `is_held()` answered `held` at `at`.
    Held { id: u64, at: Instant, held: bool },
    /// `lost()` resolved with `reason` at `at`; for several locks held together, `key`
    /// is the key of the lock it named (`MultiGuard::lost_which`).
    Lost {
        id: u64,
        at: Instant,
        reason: LossReason,
        key: Option<String>,
    },
    /// Acquisition `id` of `name` (several locks: their names sorted, joined by commas)
    /// failed with `error`; `key_deleted`: it was told its key was deleted while it
    /// waited, and for several locks `deleted_lock` is the lock the error named.
    Failed {
        id: u64,
        client: usize,
        name: String,
        at: Instant,
        error: String,
        key_deleted: bool,
        deleted_lock: Option<String>,
    },
    /// Acquisition `id` returned without the lock: a `try` that found it taken, or a
    /// wait that timed out.
    Missed { id: u64, at: Instant },
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
pub(super) struct Life {
    pub(super) key: Vec<u8>,
    pub(super) prefix: Vec<u8>,
    pub(super) created: i64,
    pub(super) created_seen: Instant,
    pub(super) value: Vec<u8>,
    pub(super) lease: i64,
    pub(super) deleted: Option<(i64, Instant)>,
    /// The deletion was a request of this process's clients (`etcd::observed`): not the
    /// operator's, not its lease's end.
    pub(super) deleted_by_client: bool,
}

impl Life {
    pub(super) fn alive_at(&self, revision: i64) -> bool {
        self.created <= revision && self.deleted.is_none_or(|(d, _)| d > revision)
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
    pub(super) fn revoked_slack(&self, from: Instant, until: Instant) -> Duration {
        self.revoked
            .iter()
            .filter(|(a, b)| *a <= until && *b >= from)
            .map(|(a, b)| b.duration_since(*a) + REVOKED_SLACK)
            .sum()
    }

    /// Whether the operator may have made the deletion of `life`'s key at `revision`,
    /// seen at `seen`: one of its deletes or revokes was applied at that revision, or one
    /// that could delete that very key got no answer and was in flight around then.
    pub(super) fn explains(&self, life: &Life, revision: i64, seen: Instant) -> bool {
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
    pub(super) fn covers(&self, life: &Life) -> bool {
        match self {
            Self::Prefix(prefix) => life.key.starts_with(prefix),
            Self::Key(key) => life.key == *key,
            Self::Lease(lease) => life.lease == *lease,
        }
    }
}

/// The soak acquisition whose key holds `value` (`workload::label`: the end of its holder
/// record, or an election's whole value).
pub(super) fn acquisition_of(value: &[u8]) -> Option<u64> {
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

/// Every key's life under `namespace`, from the history; `by_clients` are the deletions
/// the clients made.
pub(super) fn lives(
    history: &[Observed],
    namespace: &str,
    by_clients: &HashSet<(Vec<u8>, i64)>,
) -> Vec<Life> {
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
pub(super) fn prefix_of(key: &[u8], namespace: &str) -> Vec<u8> {
    let skip = namespace.len() + 1;
    let rest = key.get(skip..).unwrap_or_default();
    let end = rest
        .iter()
        .position(|b| *b == b'/')
        .map_or(key.len(), |p| skip + p + 1);
    key[..end].to_vec()
}

/// When the recorder first saw each revision.
pub(super) fn revision_times(history: &[Observed]) -> HashMap<i64, Instant> {
    let mut times = HashMap::new();
    for event in history {
        times.entry(event.revision).or_insert(event.seen);
    }
    times
}

/// The history of `prefix` around `revision`, for a violation's report.
pub(super) fn history_around(history: &[Observed], prefix: &[u8], revision: i64) -> String {
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
