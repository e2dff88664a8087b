//! What this process's etcd requests did that the soak's checker cannot see in etcd's
//! history (testkit builds only): requests whose outcome was unknown, joins that adopted
//! their own earlier attempt's key, which deletions in the history were this process's
//! own requests, and at which revision a wait concluded that its key was gone.
//!
//! A deletion in a watch looks the same whoever made it: a client's delete, the operator,
//! a lease's end. The checker must not excuse a key that an acquisition was told was
//! deleted (or that went while it was held) as "gone with its lease" when in fact the
//! process's own request deleted it, so answered deletes that removed a key are recorded
//! with the revision they were applied at, exactly (the answer's header revision is the
//! deletion's revision in the history). A delete without an answer cannot be recorded;
//! so a wait's conclusion "my key is gone" is recorded too, with the token it looked for
//! and the revision of the read or watch event it concluded from: the checker holds it
//! against the history (that key's life ended at or before that revision), whoever
//! deleted the key afterwards and whether or not that delete was answered.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// This process's requests whose outcome was unknown, and joins that found their own
/// earlier attempt's key (for the soak's report: how often the rules of `key_life.rs`
/// were put to the test).
pub(super) struct Unanswered {
    pub(super) deletes: AtomicU64,
    pub(super) joins: AtomicU64,
    pub(super) adopted: AtomicU64,
}

pub(super) static UNANSWERED: Unanswered = Unanswered {
    deletes: AtomicU64::new(0),
    joins: AtomicU64::new(0),
    adopted: AtomicU64::new(0),
};

/// (deletes, joins) of this process so far whose outcome was unknown, and joins that
/// adopted the key an earlier attempt of theirs had made.
pub(crate) fn unanswered_so_far() -> (u64, u64, u64) {
    (
        UNANSWERED.deletes.load(Ordering::Relaxed),
        UNANSWERED.joins.load(Ordering::Relaxed),
        UNANSWERED.adopted.load(Ordering::Relaxed),
    )
}

/// Whether a soak is recording (a bench in the same binary would otherwise keep every
/// key it ever deleted).
static RECORDING: AtomicBool = AtomicBool::new(false);

static RECORDED: Mutex<Option<Recorded>> = Mutex::new(None);

fn recorded() -> std::sync::MutexGuard<'static, Option<Recorded>> {
    RECORDED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What this process's requests and waits said about keys while a soak recorded.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    /// (key, revision) of every deletion by this process's own answered requests.
    pub(crate) own_deletes: HashSet<(Vec<u8>, i64)>,
    /// (key, token, revision): a wait concluded that its key (the one created at
    /// `token`) was gone, from a read or a watch event at `revision`.
    pub(crate) seen_gone: Vec<(Vec<u8>, i64, i64)>,
}

/// Records until [`finish`](Self::finish)ed or dropped (one soak per process: a second
/// recording would start afresh and take the first one's records).
#[must_use = "recording stops when this is dropped"]
pub(crate) struct Recording(());

impl Recording {
    /// Starts recording afresh.
    pub(crate) fn start() -> Self {
        *recorded() = Some(Recorded::default());
        RECORDING.store(true, Ordering::Release);
        Self(())
    }

    /// Stops recording; what was recorded since [`start`](Self::start).
    pub(crate) fn finish(self) -> Recorded {
        RECORDING.store(false, Ordering::Release);
        recorded().take().unwrap_or_default()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDING.store(false, Ordering::Release);
    }
}

fn record(what: impl FnOnce(&mut Recorded)) {
    if !RECORDING.load(Ordering::Acquire) {
        return;
    }
    if let Some(recorded) = recorded().as_mut() {
        what(recorded);
    }
}

/// A request of this process deleted `key` at `revision` (its answer said so).
pub(super) fn deleted(key: &[u8], revision: Option<i64>) {
    if let Some(revision) = revision {
        record(|r| {
            r.own_deletes.insert((key.to_vec(), revision));
        });
    }
}

/// A wait concluded that `key`, created at `token`, was gone as of `revision`.
pub(super) fn concluded_gone(key: &[u8], token: i64, revision: i64) {
    record(|r| r.seen_gone.push((key.to_vec(), token, revision)));
}
