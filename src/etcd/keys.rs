//! Lock key layout: `<namespace>/<name>/<lease id hex>-<slot>`.
//!
//! Public so that operators' tools can find a lock's holder and waiters (`etcdctl get
//! --prefix <lock_prefix>`), sorted by create revision.
//!
//! The lease id makes keys unique across clients; the slot makes them unique across the
//! acquisitions one client runs at once on one lock, so two tasks sharing a session each
//! get their own place in the queue and exclude each other (Go's mutex uses one key per
//! session and does not). Slots are reused once a key is confirmed gone (`slots.rs`).

use std::sync::Arc;

/// The prefix that holds every key (holder and waiters) of one lock.
pub fn lock_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}/")
}

/// One acquisition's key under `prefix`.
pub fn waiter_key(prefix: &str, lease_id: i64, slot: u64) -> String {
    format!("{prefix}{lease_id:016x}-{slot}")
}

/// A lock's prefix, `<namespace>/<name>/`, in one shared allocation (the session's slot
/// table keeps it: `slots.rs`), and where the lock's name sits in it: an acquisition, its
/// requests and its watch carry this instead of copies of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockPath {
    prefix: Arc<str>,
    name_start: usize,
}

impl LockPath {
    /// `prefix` is [`lock_prefix`]`(namespace, name)`.
    pub(crate) fn new(prefix: Arc<str>, namespace: &str) -> Self {
        debug_assert!(prefix.starts_with(namespace) && prefix.ends_with('/'));
        Self {
            prefix,
            name_start: namespace.len() + 1,
        }
    }

    /// `<namespace>/<name>/`.
    pub(crate) fn prefix(&self) -> &Arc<str> {
        &self.prefix
    }

    /// The lock's name.
    pub(crate) fn name(&self) -> &str {
        let end = self.prefix.len().saturating_sub(1);
        self.prefix.get(self.name_start..end).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sit_under_their_lock_prefix() {
        let prefix = lock_prefix("fencelock", "orders");
        assert_eq!(prefix, "fencelock/orders/");
        let key = waiter_key(&prefix, 0x694d_7f3c_2b1a, 7);
        assert_eq!(key, "fencelock/orders/0000694d7f3c2b1a-7");
        assert!(key.starts_with(&prefix));
    }

    #[test]
    fn a_lock_path_names_its_lock() {
        let path = LockPath::new(Arc::from(lock_prefix("ns/deep", "orders")), "ns/deep");
        assert_eq!(path.name(), "orders");
        assert_eq!(&**path.prefix(), "ns/deep/orders/");
    }

    #[test]
    fn a_lock_prefix_never_contains_another_locks_keys() {
        // Names cannot contain '/', so "a/" never prefixes the keys of "ab".
        let a = lock_prefix("ns", "a");
        let ab = waiter_key(&lock_prefix("ns", "ab"), 1, 1);
        assert!(!ab.starts_with(&a));
    }
}
