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
    /// The per-lock counter that hands out fencing tokens, the channel where releases
    /// are announced to waiters, and the set of waiters that want the announcement, in
    /// one allocation (see [`Names::counter`]).
    text: Box<str>,
    /// Where the counter ends and the channel starts in `text`, then where the channel
    /// ends and the waiters' set starts.
    split: [usize; 2],
    /// A semaphore's permit slots; empty for a lock, whose one slot is `lock`.
    permits: Vec<Arc<str>>,
}

impl Names {
    /// The per-lock counter that hands out fencing tokens.
    pub(crate) fn counter(&self) -> &str {
        self.text.get(..self.split[0]).unwrap_or_default()
    }

    /// Where releases are announced to waiters.
    pub(crate) fn channel(&self) -> &str {
        self.text
            .get(self.split[0]..self.split[1])
            .unwrap_or_default()
    }

    /// The sorted set of the waiters subscribed to [`channel`](Self::channel) (member: a
    /// waiter's id, score: when its registration expires, in the server's ms): a release
    /// publishes only while it is not empty (`scripts.rs`, `RELEASE`).
    pub(crate) fn waiters(&self) -> &str {
        self.text.get(self.split[1]..).unwrap_or_default()
    }

    /// The keys an acquisition may take: the lock alone, or a semaphore's permit slots.
    /// Once granted, `lock` is the slot taken.
    pub(crate) fn slots(&self) -> &[Arc<str>] {
        if self.permits.is_empty() {
            std::slice::from_ref(&self.lock)
        } else {
            &self.permits
        }
    }
}

impl std::ops::Deref for LockKeys {
    type Target = Names;

    fn deref(&self) -> &Names {
        &self.0
    }
}

/// `parts` joined, as a shared string, in one allocation when short (every lock key of a
/// usual name): built on the stack, then copied once into the `Arc`.
fn joined(parts: &[&str]) -> Arc<str> {
    const STACK: usize = 256;
    let len: usize = parts.iter().map(|part| part.len()).sum();
    if len <= STACK {
        let mut buffer = [0u8; STACK];
        let mut at = 0;
        for part in parts {
            buffer[at..at + part.len()].copy_from_slice(part.as_bytes());
            at += part.len();
        }
        // Whole `str`s laid end to end are UTF-8.
        if let Ok(text) = std::str::from_utf8(&buffer[..at]) {
            return Arc::from(text);
        }
    }
    Arc::from(parts.concat())
}

/// `names` (each given as its parts) in one string, and where the first two end.
fn counter_channel_waiters(names: [&[&str]; 3]) -> (Box<str>, [usize; 2]) {
    let lengths = names.map(|parts| parts.iter().map(|part| part.len()).sum::<usize>());
    let mut text = String::with_capacity(lengths.iter().sum());
    for part in names.iter().flat_map(|parts| parts.iter()) {
        text.push_str(part);
    }
    (text.into_boxed_str(), [lengths[0], lengths[0] + lengths[1]])
}

impl LockKeys {
    /// The names of lock `name` under `prefix`: three allocations when the lock key fits
    /// [`joined`]'s stack buffer (the lock key's `Arc`, the counter and channel, the
    /// `Arc<Names>`); it was about a dozen with `format!`, and names are built per call.
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let (text, split) = counter_channel_waiters([
            &[prefix, ":token:", name],
            &[prefix, ":released:", name],
            &[prefix, ":waiters:", name],
        ]);
        Self(Arc::new(Names {
            lock: joined(&[prefix, ":lock:", name]),
            text,
            split,
            permits: Vec::new(),
        }))
    }

    /// A semaphore's `permits` slots, its counter, channel and waiters (segments of their
    /// own).
    /// `permits` must be at least 1 (`RedisSemaphore::new` refuses 0): with none, the
    /// names would stand for a lock on an empty key.
    pub(crate) fn permits(prefix: &str, name: &str, permits: usize) -> Self {
        debug_assert!(permits > 0, "a semaphore has at least one permit");
        let slots: Vec<Arc<str>> = (0..permits)
            .map(|i| Arc::from(format!("{prefix}:permit:{name}:{i}")))
            .collect();
        let (text, split) = counter_channel_waiters([
            &[prefix, ":permit-token:", name],
            &[prefix, ":permit-released:", name],
            &[prefix, ":permit-waiters:", name],
        ]);
        Self(Arc::new(Names {
            lock: slots.first().cloned().unwrap_or_else(|| Arc::from("")),
            text,
            split,
            permits: slots,
        }))
    }

    /// These names with the lock being slot `slot`: the same names (no copy) when that
    /// slot is the lock already, as it always is for a lock's one slot.
    pub(crate) fn granted(&self, slot: usize) -> Self {
        match self.slots().get(slot) {
            Some(lock) if *lock != self.lock => Self(Arc::new(Names {
                lock: lock.clone(),
                text: self.text.clone(),
                split: self.split,
                permits: self.permits.clone(),
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
        let all: [&str; 8] = [
            &a.lock,
            a.counter(),
            a.channel(),
            a.waiters(),
            &a_token.lock,
            a_token.counter(),
            a_token.channel(),
            a_token.waiters(),
        ];
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(&*a.lock, "p:lock:a");
        assert_eq!(a.counter(), "p:token:a");
        assert_eq!(a.channel(), "p:released:a");
        assert_eq!(a.waiters(), "p:waiters:a");
        assert_eq!(a.slots(), std::slice::from_ref(&a.lock));
        // Past the stack buffer: the same names.
        let long = "n".repeat(300);
        let b = LockKeys::new("p", &long);
        assert_eq!(&*b.lock, format!("p:lock:{long}"));
        assert_eq!(b.channel(), format!("p:released:{long}"));
        assert_eq!(b.waiters(), format!("p:waiters:{long}"));
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
        assert_eq!(permits.granted(2).counter(), permits.counter());
        assert_eq!(permits.granted(2).channel(), "p:permit-released:s");
        assert_eq!(permits.granted(2).waiters(), "p:permit-waiters:s");
        assert_eq!(permits.slots().len(), 3);
        assert_eq!(&*permits.granted(0).lock, "p:permit:s:0");
    }
}
