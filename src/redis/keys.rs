//! Key and channel names of one Redis lock.
//!
//! Each kind of name gets its own middle segment, so that no lock name (which may contain
//! ':') can make one lock's key collide with another lock's counter or channel.

/// The names used by one lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The lock itself: `SET NX PX` with the owner value.
    pub(crate) lock: String,
    /// The per-lock counter that hands out fencing tokens.
    pub(crate) counter: String,
    /// Where releases are announced to waiters.
    pub(crate) channel: String,
    /// The keys an acquisition may take: the lock alone, or a semaphore's permit slots.
    /// Once granted, `lock` is the slot taken.
    pub(crate) slots: Vec<String>,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = format!("{prefix}:lock:{name}");
        Self {
            slots: vec![lock.clone()],
            lock,
            counter: format!("{prefix}:token:{name}"),
            channel: format!("{prefix}:released:{name}"),
        }
    }

    /// A semaphore's `permits` slots, its counter and channel (segments of their own).
    pub(crate) fn permits(prefix: &str, name: &str, permits: usize) -> Self {
        let slots: Vec<String> = (0..permits)
            .map(|i| format!("{prefix}:permit:{name}:{i}"))
            .collect();
        Self {
            lock: slots.first().cloned().unwrap_or_default(),
            slots,
            counter: format!("{prefix}:permit-token:{name}"),
            channel: format!("{prefix}:permit-released:{name}"),
        }
    }

    /// These names with the lock being slot `slot`.
    pub(crate) fn granted(&self, slot: usize) -> Self {
        let mut keys = self.clone();
        if let Some(lock) = self.slots.get(slot) {
            keys.lock.clone_from(lock);
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_different_locks_never_collide() {
        let a = LockKeys::new("p", "a");
        let a_token = LockKeys::new("p", "a:token");
        let all = [
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
        assert_eq!(a.lock, "p:lock:a");
    }
}
