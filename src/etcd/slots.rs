//! Key names of one session: each acquisition takes the lowest slot number free for its
//! lock name, and gives it back only once its key is confirmed deleted.
//!
//! Why reuse names: etcd keeps every deleted key in its index until the next compaction,
//! and every range read over a lock's prefix (the join, the read of one's place) visits
//! them. A new name per acquisition would make a hot lock's reads slower with every cycle
//! until the cluster compacts (a lock taken 1,000 times a second leaves 300,000 dead keys
//! in five minutes); a name per (session, slot) bounds them by the number of acquisitions
//! a session runs at once on that lock, as Go's one-key-per-session does.
//!
//! Why only after a confirmed delete: then no request of an earlier acquisition (a retried
//! release, a delete in flight) can meet the new key of the same name, so deleting exactly
//! one's key stays as safe as a delete guarded by its create revision.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The slots in use, per lock prefix; an entry goes when its last slot is given back, so
/// the table holds only the acquisitions running now.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    in_use: Mutex<HashMap<String, Vec<u64>>>,
}

impl Slots {
    fn table(&self) -> MutexGuard<'_, HashMap<String, Vec<u64>>> {
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lowest slot free for `prefix`, now in use.
    pub(crate) fn take(&self, prefix: &str) -> u64 {
        let mut table = self.table();
        let used = table.entry(prefix.to_owned()).or_default();
        let slot = (0..).find(|s| !used.contains(s)).unwrap_or(u64::MAX);
        used.push(slot);
        slot
    }

    /// `slot` of `prefix` is free again: its key is confirmed gone (or was never made).
    pub(crate) fn give_back(&self, prefix: &str, slot: u64) {
        let mut table = self.table();
        if let Some(used) = table.get_mut(prefix) {
            used.retain(|s| *s != slot);
            if used.is_empty() {
                table.remove(prefix);
            }
        }
    }

    /// How many slots are in use, over every prefix.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_slot_is_reused_once_given_back() {
        let slots = Slots::default();
        assert_eq!(slots.take("a/"), 0);
        assert_eq!(slots.take("a/"), 1);
        assert_eq!(slots.take("b/"), 0);
        slots.give_back("a/", 0);
        assert_eq!(slots.take("a/"), 0);
        assert_eq!(slots.take("a/"), 2);
        for slot in 0..3 {
            slots.give_back("a/", slot);
        }
        slots.give_back("b/", 0);
        assert_eq!(slots.len(), 0, "no entry left for idle names");
    }
}
