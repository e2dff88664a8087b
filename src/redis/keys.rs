//! Key and channel names of one Redis lock.
//!
//! Each kind of name gets its own middle segment, so that no lock name (which may contain
//! ':') can make one lock's key collide with another lock's counter or channel.

use std::sync::Arc;

/// The names used by one lock, shared: an acquisition, its guard, the guard's background
/// release and a Redlock release on every master all hold the same names, so a clone is
/// a reference count, not four strings (the lock's client path allocated about a dozen
/// strings per cycle for these copies alone; see `fencelock bench`'s c=64 Redis row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockKeys(Arc<Names>);

/// The names themselves.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The lock itself: `SET NX PX` with the owner value.
    pub(crate) lock: Arc<str>,
    /// The per-lock counter that hands out fencing tokens.
    pub(crate) counter: String,
    /// Where releases are announced to waiters.
    pub(crate) channel: String,
    /// The keys an acquisition may take: the lock alone, or a semaphore's permit slots.
    /// Once granted, `lock` is the slot taken.
    pub(crate) slots: Vec<Arc<str>>,
}

impl std::ops::Deref for LockKeys {
    type Target = Names;

    fn deref(&self) -> &Names {
        &self.0
    }
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock: Arc<str> = Arc::from(format!("{prefix}:lock:{name}"));
        Self(Arc::new(Names {
            slots: vec![lock.clone()],
            lock,
            counter: format!("{prefix}:token:{name}"),
            channel: format!("{prefix}:released:{name}"),
        }))
    }

    /// A semaphore's `permits` slots, its counter and channel (segments of their own).
    pub(crate) fn permits(prefix: &str, name: &str, permits: usize) -> Self {
        let slots: Vec<Arc<str>> = (0..permits)
            .map(|i| Arc::from(format!("{prefix}:permit:{name}:{i}")))
            .collect();
        Self(Arc::new(Names {
            lock: slots.first().cloned().unwrap_or_else(|| Arc::from("")),
            slots,
            counter: format!("{prefix}:permit-token:{name}"),
            channel: format!("{prefix}:permit-released:{name}"),
        }))
    }

    /// These names with the lock being slot `slot`: the same names (no copy) when that
    /// slot is the lock already, as it always is for a lock's one slot.
    pub(crate) fn granted(&self, slot: usize) -> Self {
        match self.slots.get(slot) {
            Some(lock) if *lock != self.lock => Self(Arc::new(Names {
                lock: lock.clone(),
                counter: self.counter.clone(),
                channel: self.channel.clone(),
                slots: self.slots.clone(),
            })),
            _ => self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_different_locks_never_collide() {
        let a = LockKeys::new("p", "a");
        let a_token = LockKeys::new("p", "a:token");
        let all: [&str; 5] = [
            &a.lock,
            &a.counter,
            &a.channel,
            &a_token.lock,
            &a_token.counter,
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(&*a.lock, "p:lock:a");
    }

    #[test]
    fn a_granted_slot_names_that_slot() {
        let single = LockKeys::new("p", "a");
        assert!(
            Arc::ptr_eq(&single.granted(0).0, &single.0),
            "no copy for a lock"
        );
        let permits = LockKeys::permits("p", "s", 3);
        assert_eq!(&*permits.granted(2).lock, "p:permit:s:2");
        assert_eq!(permits.granted(2).counter, permits.counter);
        assert_eq!(&*permits.granted(0).lock, "p:permit:s:0");
    }
}
