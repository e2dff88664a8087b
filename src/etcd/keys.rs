//! Lock key layout: `<namespace>/<name>/<lease id hex>-<slot>`.
//!
//! Public so that operators' tools can find a lock's holder and waiters (`etcdctl get
//! --prefix <lock_prefix>`), sorted by create revision.
//!
//! The lease id makes keys unique across clients; the slot makes them unique across the
//! acquisitions one client runs at once on one lock, so two tasks sharing a session each
//! get their own place in the queue and exclude each other (Go's mutex uses one key per
//! session and does not). Slots are reused once a key is confirmed gone (`slots.rs`).

/// The prefix that holds every key (holder and waiters) of one lock.
pub fn lock_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}/")
}

/// One acquisition's key under `prefix`.
pub fn waiter_key(prefix: &str, lease_id: i64, slot: u64) -> String {
    format!("{prefix}{lease_id:016x}-{slot}")
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
    fn a_lock_prefix_never_contains_another_locks_keys() {
        // Names cannot contain '/', so "a/" never prefixes the keys of "ab".
        let a = lock_prefix("ns", "a");
        let ab = waiter_key(&lock_prefix("ns", "ab"), 1, 1);
        assert!(!ab.starts_with(&a));
    }
}
