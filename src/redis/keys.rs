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
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        Self {
            lock: format!("{prefix}:lock:{name}"),
            counter: format!("{prefix}:token:{name}"),
            channel: format!("{prefix}:released:{name}"),
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
