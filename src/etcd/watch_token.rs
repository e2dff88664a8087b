//! When a refused watch means the stream's auth token went stale, and the client should
//! authenticate again and reopen its watch stream.
//!
//! etcd checks the token a stream was opened with on every watch created on it
//! (`v3rpc/watch.go` `isWatchPermitted`), and etcd-client's refresh covers unary calls
//! only: a client whose stream outlived its token (unused for `--auth-token-ttl`, or a
//! JWT's `ttl`) had every new watch cancelled, "invalid auth token" on etcd 3.4
//! ("permission denied" on some versions), and its waiters fell back to reading after
//! pauses. So such a refusal makes the client authenticate again and reopen the stream.
//!
//! But "permission denied" is also what a watch gets once its lock's keys may no longer
//! be read, and a held lock's refused watch is asked for again every 250 ms: reopening
//! the stream for each (once per [`REFRESH_EVERY`]) asked for every watch of the client
//! again from a past revision, which etcd catches up a few hundred per 100 ms, and the
//! other locks' deletions came seconds late for as long as the lock was held
//! (`tests/etcd/watch_refused_while_held.rs`). So a prefix refused again after a refresh
//! made for it is taken as refused, until its watch is created again.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::watch_state::Name;

/// How often a refusal may make the client authenticate again and reopen its stream: a
/// refusal soon after one is taken as it comes.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Whether a watch's cancel `reason` may be the stream's stale auth token.
pub(crate) fn may_be_stale_token(reason: &str) -> bool {
    reason.contains("invalid auth token") || reason.contains("permission denied")
}

/// The refreshes made for refused watches; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct TokenRefresh {
    /// When the client last authenticated again for a refused watch.
    last: Option<Instant>,
    /// The prefixes a refresh was made for whose watch has not been created since.
    refreshed_for: HashSet<Name>,
}

impl TokenRefresh {
    /// Whether the refusal (for its token, maybe) of `prefix`'s watch (`None`: not known)
    /// should make the client authenticate again and reopen its stream; if so, the
    /// attempt counts against [`REFRESH_EVERY`].
    pub(crate) fn wants_refresh(&mut self, prefix: Option<&Name>, now: Instant) -> bool {
        if prefix.is_some_and(|prefix| self.refreshed_for.contains(prefix)) {
            return false;
        }
        if self.last.is_some_and(|at| now < at + REFRESH_EVERY) {
            return false;
        }
        self.last = Some(now);
        true
    }

    /// The client authenticated again for `prefix`'s refusal: if the new stream refuses
    /// it too, that is a real refusal.
    pub(crate) fn refreshed(&mut self, prefix: Option<Name>) {
        if let Some(prefix) = prefix {
            self.refreshed_for.insert(prefix);
        }
    }

    /// Whether a refresh was made for a prefix whose watch has not been created since (a
    /// created watch needs looking up only then).
    pub(crate) fn is_waiting(&self) -> bool {
        !self.refreshed_for.is_empty()
    }

    /// `prefix`'s watch was created: a later refusal of it may be a stale token again.
    pub(crate) fn created(&mut self, prefix: &[u8]) {
        self.refreshed_for.remove(prefix);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_prefix_refused_again_after_its_refresh_is_taken_as_refused_until_created() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        let (a, b): (Name, Name) = (Arc::from(&b"ns/a/"[..]), Arc::from(&b"ns/b/"[..]));
        assert!(refresh.wants_refresh(Some(&a), now));
        refresh.refreshed(Some(a.clone()));
        // Refused again on the new stream, now and long after: a real refusal.
        assert!(!refresh.wants_refresh(Some(&a), now + Duration::from_millis(250)));
        assert!(!refresh.wants_refresh(Some(&a), now + Duration::from_secs(60)));
        // Another prefix's refusal may still be a stale token, once per second.
        assert!(!refresh.wants_refresh(Some(&b), now + Duration::from_millis(500)));
        assert!(refresh.wants_refresh(Some(&b), now + REFRESH_EVERY));
        // Until the client could authenticate again, b's refusals may still be its token.
        assert!(refresh.wants_refresh(Some(&b), now + REFRESH_EVERY * 2));
        // Once a's watch was created, a refusal of it may be a stale token again.
        refresh.created(&a);
        assert!(refresh.wants_refresh(Some(&a), now + Duration::from_secs(120)));
    }

    #[test]
    fn an_unknown_prefix_refresh_is_limited_by_time_alone() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        assert!(refresh.wants_refresh(None, now));
        refresh.refreshed(None);
        assert!(!refresh.wants_refresh(None, now + Duration::from_millis(999)));
        assert!(refresh.wants_refresh(None, now + REFRESH_EVERY));
        assert!(!refresh.is_waiting());
    }
}
