//! What this process's etcd requests did that the soak's checker cannot see in etcd's
//! history (testkit builds only): requests whose outcome was unknown, joins that adopted
//! their own earlier attempt's key, and which deletions in the history were this
//! process's own requests.
//!
//! A deletion in a watch looks the same whoever made it: a client's delete, the operator,
//! a lease's end. The checker must not excuse a key that an acquisition was told was
//! deleted (or that went while it was held) as "gone with its lease" when in fact the
//! process's own request deleted it, so answered deletes that removed a key are recorded
//! with the revision they were applied at, exactly (the answer's header revision is the
//! deletion's revision in the history). A delete without an answer cannot be recorded:
//! the checker's other rules (spent names, the operator's windows) cover those.

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

/// Whether deletions are being recorded: only while a soak runs (a bench in the same
/// binary would otherwise keep every key it ever deleted).
static RECORDING: AtomicBool = AtomicBool::new(false);

/// (key, revision) of every confirmed deletion by this process's own requests while
/// recording.
static OWN_DELETES: Mutex<Option<Deletions>> = Mutex::new(None);

/// (key, revision) pairs of confirmed deletions.
type Deletions = HashSet<(Vec<u8>, i64)>;

fn own_deletes() -> std::sync::MutexGuard<'static, Option<Deletions>> {
    OWN_DELETES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts recording this process's deletions afresh.
pub(crate) fn record_own_deletes() {
    *own_deletes() = Some(HashSet::new());
    RECORDING.store(true, Ordering::Release);
}

/// Stops recording and returns what was recorded since [`record_own_deletes`].
pub(crate) fn own_deletes_recorded() -> HashSet<(Vec<u8>, i64)> {
    RECORDING.store(false, Ordering::Release);
    own_deletes().take().unwrap_or_default()
}

/// A request of this process deleted `key` at `revision` (its answer said so).
pub(super) fn deleted(key: &[u8], revision: Option<i64>) {
    if !RECORDING.load(Ordering::Acquire) {
        return;
    }
    if let (Some(recorded), Some(revision)) = (own_deletes().as_mut(), revision) {
        recorded.insert((key.to_vec(), revision));
    }
}
