//! When a refused watch means the stream's auth token went stale, and the client should
//! authenticate again and reopen its watch stream.
//!
//! etcd checks the token a stream was opened with on every watch created on it
//! (`v3rpc/watch.go` `isWatchPermitted`), and etcd-client's refresh covers unary calls
//! only: a client whose stream outlived its token (unused for `--auth-token-ttl`, or a
//! JWT's `ttl`) had every new watch cancelled, and its waiters fell back to reading after
//! pauses (`tests/etcd/auth_token_expiry.rs`). etcd refuses an expired token as "invalid
//! auth token" (3.4.22 and 3.5.6 on, by their `v3rpc/watch.go`; earlier 3.4 and 3.5
//! releases as "permission denied"), and a JWT issued before a change of users or roles
//! as "revision of auth store is old" (seen on 3.4.23 and 3.5.16:
//! `tests/etcd/auth_changed_jwt.rs`). The last two are the token's for sure: the
//! client authenticates again and reopens the stream without a check (at most once a
//! second; a watch refused meanwhile is asked for again after a pause).
//!
//! But "permission denied" is also what a watch gets once its lock's keys may no longer be
//! read, and a held lock's refused watch is asked for again every 250 ms. Reopening the
//! stream for that (once a second) asked for every watch of the client again from a past
//! revision, which etcd catches up a few hundred per 100 ms: with many locks watched,
//! their deletions came seconds late for as long as the lock was held
//! (`tests/etcd/watch_refused_while_held.rs`). So such a refusal is first told apart by a
//! read of the same prefix (a unary call, whose token etcd-client renews when it is
//! invalid; a read refused as "auth store is old" counts as stale too): the stream's token
//! is stale only if the read is allowed. At most [`CHECKS_PER_SECOND`] prefixes are read a
//! second (a read blocks the watch task), a prefix whose read was denied not again for a
//! while (doubling from 2 s to [`MAX_BACKOFF`]: a few truly refused locks retried every
//! 250 ms must not take every check), and one prefix's denied read tells nothing of
//! another's. A refusal not checked, or within a second of a refresh, is taken as it
//! comes; one found stale whose refresh failed is a gap (asked for again after a pause),
//! never a refusal.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use etcd_client::{GetOptions, KvClient};
use tokio::time::Instant;

use super::watch_state::Name;

/// How often the client may authenticate again and reopen its stream for a refusal.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How many refused prefixes may be checked by a read per second.
const CHECKS_PER_SECOND: usize = 4;

/// The longest a prefix whose read was denied waits for its next check.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A cancel reason that says the stream's token is stale for sure: what the hub uses for a
/// refusal its check found stale, when the refresh then failed.
pub(crate) const STALE_TOKEN: &str = "the watch stream's auth token is stale";

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

/// Whether an error or cancel `reason` says the stream's token is stale for sure.
pub(crate) fn is_stale_token(reason: &str) -> bool {
    reason.contains("invalid auth token")
        || reason.contains("auth store is old")
        || reason.contains(STALE_TOKEN)
}

/// What a read of a refused watch's prefix told.
pub(crate) enum Check {
    /// Allowed: the refusal was the stream's stale token.
    Allowed,
    /// Refused for a stale token itself.
    Stale,
    /// Denied: the refusal was real.
    Denied,
    /// Nothing (a timeout, another error).
    Unknown,
}

/// Reads the keys under `prefix` (a unary read, whose auth token etcd-client renews when
/// it is invalid) to tell what a refusal of its watch was, within `timeout` (the watch
/// task reads no answer meanwhile).
pub(crate) async fn check_read(mut kv: KvClient, prefix: &[u8], timeout: Duration) -> Check {
    let options = GetOptions::new().with_prefix().with_count_only();
    match tokio::time::timeout(timeout, kv.get(prefix, Some(options))).await {
        Ok(Ok(_)) => Check::Allowed,
        // etcd-client renews a token only when it is invalid, not when its auth revision
        // is old (a JWT after a role changed).
        Ok(Err(err)) if is_stale_token(&err.to_string()) => Check::Stale,
        Ok(Err(err)) if err.to_string().contains("permission denied") => {
            tracing::debug!(%err, "a refused watch's prefix cannot be read either");
            Check::Denied
        }
        Ok(Err(err)) => {
            tracing::debug!(%err, "could not tell what refused a watch");
            Check::Unknown
        }
        Err(_) => Check::Unknown,
    }
}

/// The refreshes and checks made for refused watches; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct TokenRefresh {
    /// When the client last tried to authenticate again for a refused watch.
    refreshed: Option<Instant>,
    /// When the checks of the last second were made.
    recent: VecDeque<Instant>,
    /// Prefixes whose read was denied: when each may be checked again, and its backoff.
    denied: HashMap<Name, (Instant, Duration)>,
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
        while self
            .recent
            .front()
            .is_some_and(|at| *at + Duration::from_secs(1) <= now)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= CHECKS_PER_SECOND
            || self.denied.get(prefix).is_some_and(|(next, _)| now < *next)
        {
            return false;
        }
        self.recent.push_back(now);
        // Forget the backoffs long past (bounded work: at most a few checks a second).
        self.denied
            .retain(|_, (next, backoff)| now < *next + *backoff + MAX_BACKOFF);
        true
    }

    /// `prefix`'s read was allowed: any backoff of it is over (its permission is back).
    pub(crate) fn allowed(&mut self, prefix: &[u8]) {
        self.denied.remove(prefix);
    }

    /// `prefix`'s read was denied at `now` (a real refusal), or told nothing (it timed
    /// out: the task must not spend its time on such reads): checked again only later.
    pub(crate) fn denied(&mut self, prefix: &Name, now: Instant) {
        let backoff = self
            .denied
            .get(prefix)
            .map_or(Duration::from_secs(2), |(_, backoff)| *backoff * 2)
            .min(MAX_BACKOFF);
        self.denied.insert(prefix.clone(), (now + backoff, backoff));
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
    fn a_few_prefixes_are_checked_a_second_and_a_denied_one_backs_off() {
        let now = Instant::now();
        let mut refresh = TokenRefresh::default();
        for prefix in ["a", "b", "c", "d"] {
            assert!(refresh.may_check(&name(prefix), now));
        }
        assert!(!refresh.may_check(&name("e"), now), "four a second");
        assert!(refresh.may_check(&name("e"), now + Duration::from_secs(1)));
        // A prefix whose read was denied waits 2 s, then 4 s.
        refresh.denied(&name("a"), now);
        let later = now + Duration::from_secs(1);
        assert!(!refresh.may_check(&name("a"), later));
        assert!(refresh.may_check(&name("a"), now + Duration::from_secs(2)));
        refresh.denied(&name("a"), now + Duration::from_secs(2));
        assert!(!refresh.may_check(&name("a"), now + Duration::from_secs(5)));
        assert!(refresh.may_check(&name("a"), now + Duration::from_secs(6)));
        // Readable again: no backoff left.
        refresh.denied(&name("a"), now + Duration::from_secs(6));
        refresh.allowed(b"a");
        assert!(refresh.may_check(&name("a"), now + Duration::from_secs(7)));
    }

    #[test]
    fn truly_refused_prefixes_retried_often_leave_checks_for_another() {
        // Four locks truly refused, their watches asked for again every 250 ms and
        // answered before a fifth's in every batch: the fifth is still checked soon.
        let start = Instant::now();
        let mut refresh = TokenRefresh::default();
        let refused = ["r1", "r2", "r3", "r4"];
        let mut fifth_checked = None;
        for batch in 0..40u32 {
            let now = start + Duration::from_millis(250) * batch;
            for prefix in refused {
                if refresh.may_check(&name(prefix), now) {
                    refresh.denied(&name(prefix), now);
                }
            }
            if refresh.may_check(&name("b"), now) {
                fifth_checked = Some(now - start);
                break;
            }
        }
        let checked = fifth_checked.expect("the fifth prefix was never checked in 10 s");
        assert!(checked <= Duration::from_millis(2_250), "{checked:?}");
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
