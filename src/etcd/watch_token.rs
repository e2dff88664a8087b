//! When a refused watch means the stream's auth token went stale, and the client should
//! authenticate again and reopen its watch stream.
//!
//! etcd checks the token a stream was opened with on every watch created on it
//! (`v3rpc/watch.go` `isWatchPermitted`), and etcd-client's refresh covers unary calls
//! only: a client whose stream outlived its token (unused for `--auth-token-ttl`, or a
//! JWT's `ttl`) had every new watch cancelled, and its waiters fell back to reading after
//! pauses (`tests/etcd/auth_token_expiry.rs`). etcd 3.4 and 3.5 refuse it as "permission
//! denied", later versions as "invalid auth token".
//!
//! But "permission denied" is also what a watch gets once its lock's keys may no longer be
//! read, and a held lock's refused watch is asked for again every 250 ms. Reopening the
//! stream for that (once a second) asked for every watch of the client again from a past
//! revision, which etcd catches up a few hundred per 100 ms: with many locks watched,
//! their deletions came seconds late for as long as the lock was held
//! (`tests/etcd/watch_refused_while_held.rs`). So a refusal is first told apart by a read
//! of the same prefix (a unary call, whose token etcd-client keeps fresh): the stream's
//! token is stale only if the read is allowed. The read and the reopen are tried at most
//! once per [`REFRESH_EVERY`]; a refusal meanwhile is taken as it comes.

use std::time::Duration;

use tokio::time::Instant;

/// How often a refusal may be checked (and the stream reopened for it).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Whether a watch's cancel `reason` may be the stream's stale auth token (or its auth
/// revision, older than the store's after a role changed).
pub(crate) fn may_be_stale_token(reason: &str) -> bool {
    reason.contains("permission denied")
        || reason.contains("invalid auth token")
        || reason.contains("auth store is old")
}

/// When a refusal was last checked; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct TokenRefresh {
    last: Option<Instant>,
}

impl TokenRefresh {
    /// Whether a refusal at `now` may be checked (and the stream reopened for it); if
    /// so, the check counts against [`REFRESH_EVERY`].
    pub(crate) fn may_check(&mut self, now: Instant) -> bool {
        if self.last.is_some_and(|at| now < at + REFRESH_EVERY) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_checked_at_most_once_a_second() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        assert!(refresh.may_check(now));
        assert!(!refresh.may_check(now + Duration::from_millis(999)));
        assert!(refresh.may_check(now + REFRESH_EVERY));
    }

    #[test]
    fn the_reasons_a_stale_token_is_refused_with() {
        assert!(may_be_stale_token("etcdserver: permission denied"));
        assert!(may_be_stale_token("etcdserver: invalid auth token"));
        assert!(may_be_stale_token(
            "etcdserver: revision of auth store is old"
        ));
        assert!(!may_be_stale_token(
            "mvcc: required revision has been compacted"
        ));
    }
}
