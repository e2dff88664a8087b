//! When a refused watch means the stream's auth token went stale, and the client should
//! authenticate again and reopen its watch stream.
//!
//! etcd checks the token a stream was opened with on every watch created on it
//! (`v3rpc/watch.go` `isWatchPermitted`), and etcd-client's refresh covers unary calls
//! only: a client whose stream outlived its token (unused for `--auth-token-ttl`, or a
//! JWT's `ttl`) had every new watch cancelled, and its waiters fell back to reading after
//! pauses (`tests/etcd/auth_token_expiry.rs`). etcd 3.4 and 3.5 refuse it as "permission
//! denied"; later versions as "invalid auth token", or, for a JWT issued before a role
//! changed, "revision of auth store is old". Those two are the token's for sure: the
//! client authenticates again and reopens the stream at once.
//!
//! But "permission denied" is also what a watch gets once its lock's keys may no longer be
//! read, and a held lock's refused watch is asked for again every 250 ms. Reopening the
//! stream for that (once a second) asked for every watch of the client again from a past
//! revision, which etcd catches up a few hundred per 100 ms: with many locks watched,
//! their deletions came seconds late for as long as the lock was held
//! (`tests/etcd/watch_refused_while_held.rs`). So such a refusal is first told apart by a
//! read of the same prefix (a unary call, whose token etcd-client renews when it is
//! invalid): the stream's token is stale only if the read is allowed. A prefix is read at
//! most once a second, and at most [`CHECKS_PER_SECOND`] prefixes a second: a read blocks
//! the watch task, and one prefix's denied read tells nothing of another's. A refusal not
//! checked is taken as it comes.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::watch_state::Name;

/// How often the client may authenticate again and reopen its stream for a refusal, and
/// how often one prefix's refusal may be checked by a read.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How many refused prefixes may be checked by a read per [`REFRESH_EVERY`].
const CHECKS_PER_SECOND: usize = 4;

/// What a watch's cancel reason says of the stream's auth token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenRefusal {
    /// Stale for sure ("invalid auth token", "revision of auth store is old").
    Stale,
    /// Stale, or a real refusal ("permission denied"): a read tells.
    Maybe,
}

impl TokenRefusal {
    /// What `reason` says of the token, if anything.
    pub(crate) fn of(reason: &str) -> Option<Self> {
        if is_stale_token(reason) {
            Some(Self::Stale)
        } else if reason.contains("permission denied") {
            Some(Self::Maybe)
        } else {
            None
        }
    }
}

/// Whether a cancel `reason` says the stream's token is stale for sure.
pub(crate) fn is_stale_token(reason: &str) -> bool {
    reason.contains("invalid auth token") || reason.contains("auth store is old")
}

/// The refreshes and checks made for refused watches; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct TokenRefresh {
    /// When the client last tried to authenticate again for a refused watch.
    refreshed: Option<Instant>,
    /// The prefixes checked by a read in the last [`REFRESH_EVERY`], and when.
    checked: HashMap<Name, Instant>,
}

impl TokenRefresh {
    /// Whether the client may authenticate again and reopen its stream now.
    pub(crate) fn may_refresh(&self, now: Instant) -> bool {
        self.refreshed.is_none_or(|at| now >= at + REFRESH_EVERY)
    }

    /// The client tries to authenticate again now.
    pub(crate) fn refreshing(&mut self, now: Instant) {
        self.refreshed = Some(now);
    }

    /// Whether `prefix`'s refusal may be checked by a read now; if so, it counts.
    pub(crate) fn may_check(&mut self, prefix: &Name, now: Instant) -> bool {
        self.checked.retain(|_, at| now < *at + REFRESH_EVERY);
        if self.checked.len() >= CHECKS_PER_SECOND || self.checked.contains_key(prefix) {
            return false;
        }
        self.checked.insert(prefix.clone(), now);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn name(text: &str) -> Name {
        Arc::from(text.as_bytes())
    }

    #[test]
    fn the_client_authenticates_again_at_most_once_a_second() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        assert!(refresh.may_refresh(now));
        refresh.refreshing(now);
        assert!(!refresh.may_refresh(now + Duration::from_millis(999)));
        assert!(refresh.may_refresh(now + REFRESH_EVERY));
    }

    #[test]
    fn each_prefix_is_checked_once_a_second_and_a_few_a_second_in_all() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        // One prefix's check does not use up another's (a denied read of one lock says
        // nothing of another's).
        assert!(refresh.may_check(&name("a"), now));
        assert!(!refresh.may_check(&name("a"), now + Duration::from_millis(250)));
        for other in ["b", "c", "d"] {
            assert!(refresh.may_check(&name(other), now + Duration::from_millis(300)));
        }
        assert!(!refresh.may_check(&name("e"), now + Duration::from_millis(300)));
        assert!(refresh.may_check(&name("a"), now + REFRESH_EVERY));
    }

    #[test]
    fn the_reasons_a_stale_token_is_refused_with() {
        assert_eq!(
            TokenRefusal::of("etcdserver: permission denied"),
            Some(TokenRefusal::Maybe)
        );
        assert_eq!(
            TokenRefusal::of("etcdserver: invalid auth token"),
            Some(TokenRefusal::Stale)
        );
        assert_eq!(
            TokenRefusal::of("etcdserver: revision of auth store is old"),
            Some(TokenRefusal::Stale)
        );
        assert_eq!(
            TokenRefusal::of("mvcc: required revision has been compacted"),
            None
        );
    }
}
