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
//!
//! The table also keeps each lock prefix in use once: [`Slots::take`] hands out the
//! table's own copy, which the acquisition, its requests and the watch hub share instead
//! of copies of their own (one client may hold 100,000 locks; each copy is a heap block).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The slots of one prefix in use: the first 64 as bits, the rest (a session running
/// more than 64 acquisitions of one lock at once) listed, boxed so that the common entry
/// is two words.
#[derive(Debug, Default)]
struct InUse {
    low: u64,
    #[allow(clippy::box_collection)] // the box is what keeps the common entry two words
    high: Option<Box<Vec<u64>>>,
}

impl InUse {
    fn take(&mut self) -> u64 {
        if self.low != u64::MAX {
            let slot = (!self.low).trailing_zeros();
            self.low |= 1 << slot;
            return u64::from(slot);
        }
        let high = self.high.get_or_insert_default();
        let slot = (64..).find(|s| !high.contains(s)).unwrap_or(u64::MAX);
        high.push(slot);
        slot
    }

    fn give_back(&mut self, slot: u64) {
        if slot < 64 {
            self.low &= !(1 << slot);
        } else if let Some(high) = &mut self.high {
            high.retain(|s| *s != slot);
            if high.is_empty() {
                self.high = None;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.low == 0 && self.high.is_none()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.low.count_ones() as usize + self.high.as_ref().map_or(0, |high| high.len())
    }
}

/// The slots in use, per lock prefix; an entry goes when its last slot is given back, so
/// the table holds only the acquisitions running now.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    in_use: Mutex<HashMap<Arc<str>, InUse>>,
    /// The newest store revision at which a delete of one of this session's keys was
    /// confirmed (recorded before its name is given back): every key an earlier
    /// acquisition made under a name handed out after that has a lower create revision,
    /// so a key found under the name with a create revision at or below this floor is
    /// never the new acquisition's own (`key_life.rs`).
    deleted_through: AtomicI64,
}

impl Slots {
    fn table(&self) -> MutexGuard<'_, HashMap<Arc<str>, InUse>> {
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lowest slot free for `prefix`, now in use, and the table's copy of `prefix`.
    pub(crate) fn take(&self, prefix: &str) -> (Arc<str>, u64) {
        let mut table = self.table();
        let existing = table
            .get_key_value(prefix)
            .map(|(shared, _)| shared.clone());
        if let Some(shared) = existing {
            let slot = table.get_mut(prefix).map_or(u64::MAX, InUse::take);
            return (shared, slot);
        }
        let shared: Arc<str> = Arc::from(prefix);
        let mut used = InUse::default();
        let slot = used.take();
        table.insert(shared.clone(), used);
        (shared, slot)
    }

    /// `slot` of `prefix` is free again: its key is confirmed gone (or was never made).
    pub(crate) fn give_back(&self, prefix: &str, slot: u64) {
        let mut table = self.table();
        if let Some(used) = table.get_mut(prefix) {
            used.give_back(slot);
            if used.is_empty() {
                table.remove(prefix);
            }
        }
    }

    /// A delete of one of this session's keys was confirmed at store revision
    /// `revision`: recorded before the key's name is given back.
    pub(crate) fn deleted_at(&self, revision: i64) {
        self.deleted_through.fetch_max(revision, Ordering::AcqRel);
    }

    /// The newest revision recorded by [`Slots::deleted_at`]; read after [`Slots::take`],
    /// it is at least the revision of the delete that freed the slot taken.
    pub(crate) fn deleted_through(&self) -> i64 {
        self.deleted_through.load(Ordering::Acquire)
    }

    /// How many slots are in use, over every prefix.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().values().map(InUse::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_slot_is_reused_once_given_back() {
        let slots = Slots::default();
        assert_eq!(slots.take("a/").1, 0);
        assert_eq!(slots.take("a/").1, 1);
        assert_eq!(slots.take("b/").1, 0);
        slots.give_back("a/", 0);
        assert_eq!(slots.take("a/").1, 0);
        assert_eq!(slots.take("a/").1, 2);
        for slot in 0..3 {
            slots.give_back("a/", slot);
        }
        slots.give_back("b/", 0);
        assert_eq!(slots.len(), 0, "no entry left for idle names");
    }

    #[test]
    fn past_64_slots_of_one_prefix_the_lowest_free_is_still_taken() {
        let slots = Slots::default();
        for expected in 0..70 {
            assert_eq!(slots.take("a/").1, expected);
        }
        slots.give_back("a/", 65);
        slots.give_back("a/", 3);
        assert_eq!(slots.take("a/").1, 3);
        assert_eq!(slots.take("a/").1, 65);
        assert_eq!(slots.take("a/").1, 70);
        for slot in 0..71 {
            slots.give_back("a/", slot);
        }
        assert_eq!(slots.len(), 0);
    }

    #[test]
    fn acquisitions_of_one_prefix_share_the_tables_copy_of_it() {
        let slots = Slots::default();
        let (first, _) = slots.take("a/");
        let (second, _) = slots.take("a/");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(&*first, "a/");
    }
}
