//! The fencing token: the number that makes a lock safe to rely on.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A number attached to every grant of a lock, larger than the number of every earlier grant
/// of the same lock.
///
/// Storage that remembers the largest token it has seen, and refuses writes carrying an
/// older one, stays correct even when a lock holder pauses past its lease and carries on
/// believing it still holds the lock: the stale holder's writes are rejected.
///
/// Equal tokens mean the same grant. How strong the ordering is depends on the backend:
/// for etcd the token is the lock key's create revision, assigned by the Raft log, so it
/// never goes backwards and is never handed out twice, even across leader failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value, as read back from storage or passed between processes.
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, for storing next to the data it protects.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Converts an etcd revision (a positive `i64`) into a token.
    ///
    /// Returns `None` for zero or negative revisions, which etcd never assigns to a key.
    #[must_use]
    #[cfg(feature = "etcd")]
    pub(crate) fn from_revision(revision: i64) -> Option<Self> {
        u64::try_from(revision).ok().filter(|v| *v > 0).map(Self)
    }

    /// The token as an etcd revision, for revision comparisons in transactions.
    #[must_use]
    #[cfg(feature = "etcd")]
    pub(crate) fn as_revision(self) -> i64 {
        // Tokens of the etcd backend come from `from_revision`, so they fit in an i64;
        // a token made by hand that does not fit cannot match any revision.
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_value() {
        assert!(FencingToken::new(41) < FencingToken::new(42));
        assert_eq!(FencingToken::new(7), FencingToken::new(7));
    }

    #[test]
    fn revisions_must_be_positive() {
        assert_eq!(FencingToken::from_revision(0), None);
        assert_eq!(FencingToken::from_revision(-3), None);
        assert_eq!(
            FencingToken::from_revision(9).map(FencingToken::get),
            Some(9)
        );
        assert_eq!(FencingToken::new(9).as_revision(), 9);
        assert_eq!(FencingToken::new(u64::MAX).as_revision(), i64::MAX);
    }

    #[test]
    fn displays_and_serializes_as_a_bare_number() {
        let token = FencingToken::new(1234);
        assert_eq!(token.to_string(), "1234");
        assert_eq!(serde_json::to_string(&token).ok().as_deref(), Some("1234"));
        let back: Result<FencingToken, _> = serde_json::from_str("1234");
        assert_eq!(back.ok(), Some(token));
    }
}
