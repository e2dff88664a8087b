//! Authenticating again when etcd refuses a request's token as older than its auth store.
//!
//! etcd stamps each request with an auth store revision and refuses it, before applying
//! anything, when a change of users or roles came after that revision: "revision of auth
//! store is old" (`ErrAuthOldRevision`, `InvalidArgument`; `auth/store.go`
//! `isOpPermitted`, asked by `apply_auth.go` before the request is applied). A JWT carries
//! the revision it was issued at, so after any change anywhere in the cluster every
//! request of a client fails until it authenticates again; a simple token (or a
//! certificate's user) gets the store's revision when the request enters the server, and
//! fails only when a change is applied between that and its own apply. etcd's Go client
//! authenticates again and retries on this error (`clientv3/retry_interceptor.go`,
//! `shouldRefreshToken`); etcd-client does so only for "invalid auth token", so without
//! this a JWT client could not take, wait for or release any lock until its token
//! expired (5 minutes by default: `tests/etcd/auth_changed_jwt.rs`).
//!
//! The refusal proves the request was not applied (`apply_auth.go` checks every
//! operation of a transaction before it applies any, and every member agrees on the auth
//! revision since etcd 3.4.8, PR #11652; `docs/server-versions.md` gives the floor, 3.4.22
//! / 3.5.6, for the refusals taken as not applied), so sending it again is safe for every
//! request, a guarded write included ([`call_renewing`](super::call::call_renewing)).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;

use crate::{Backend, LockError};

/// etcd's text for a request whose token is older than the auth store
/// (`api/v3rpc/rpctypes/error.go`, `ErrGRPCAuthOldRevision`).
const OLD_REVISION: &str = "etcdserver: revision of auth store is old";

/// How many times one request is sent again after authenticating again: more than one
/// only when users or roles keep changing while it is sent.
pub(crate) const MAX_RENEWALS: u32 = 3;

/// Whether `err` is etcd's refusal of a token older than its auth store.
pub(crate) fn is_old_auth_revision(err: &LockError) -> bool {
    matches!(err, LockError::Backend { source, .. } if source.to_string().contains(OLD_REVISION))
}

/// How long a failed renewal answers for every request refused with the same token:
/// those queued behind it fail with it rather than each authenticate in turn (etcd
/// checks a password with bcrypt, milliseconds of its CPU each, and in 3.4 and 3.5 an
/// authentication goes through Raft: a cluster without a leader would get one per
/// request, each waiting out its timeout behind the one before).
const FAILURE_HOLDS: Duration = Duration::from_secs(1);

/// The client's token renewal after such refusals, shared by every request of one
/// client and by its watch stream: one change of users or roles, refused to many
/// requests at once, makes one authentication, not one each.
#[derive(Clone)]
pub(crate) struct TokenRenewal {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// Renewals made so far: a request notes it before it is sent, and a refusal of it
    /// renews only if none was made since.
    renewals: AtomicU64,
    /// One renewal at a time; the last failed one.
    renewing: tokio::sync::Mutex<Option<Failure>>,
}

/// A renewal that failed.
struct Failure {
    /// The renewals made before it (the token it meant to replace).
    seen: u64,
    at: Instant,
    /// etcd refused the credentials: its message.
    denied: Option<String>,
}

impl std::fmt::Debug for TokenRenewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRenewal")
            .field("renewals", &self.inner.renewals.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl TokenRenewal {
    /// Renewal for `client`'s token (shared by every sub-client made from it).
    pub(crate) fn new(client: Client) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                renewals: AtomicU64::new(0),
                renewing: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// What a request notes before it is sent, for [`renew`](Self::renew).
    pub(crate) fn seen(&self) -> u64 {
        self.inner.renewals.load(Ordering::Acquire)
    }

    /// Authenticates again, unless another request did since `seen` (its refusal was of
    /// the token that renewal replaced), or a renewal of the same token failed less than
    /// [`FAILURE_HOLDS`] ago (then fails as that one did, without asking etcd). The
    /// whole of it, the wait for a renewal in progress included, is bounded by `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the token is replaced only once a new one was granted.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub(crate) async fn renew(&self, seen: u64, timeout: Duration) -> Result<(), LockError> {
        let timed_out = || LockError::Timeout {
            backend: Backend::Etcd,
            operation: "authenticate",
            lock: None,
            after: timeout,
        };
        // One deadline for the wait and the authentication: a renewal that times out is
        // held as a failure too (else each request queued behind a stalled one would
        // authenticate in turn).
        let deadline = Instant::now() + timeout;
        let Ok(mut last) = tokio::time::timeout_at(deadline, self.inner.renewing.lock()).await
        else {
            return Err(timed_out());
        };
        if self.inner.renewals.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        if let Some(failed) = last.as_ref().filter(|f| f.seen == seen) {
            if failed.at.elapsed() < FAILURE_HOLDS {
                return Err(failed.error());
            }
        }
        // What is left of this caller's time once its turn came: a timeout within less
        // than half its own bound (it waited behind another renewal, or was given little)
        // says nothing for the callers behind it, and is not held.
        let budget = deadline.saturating_duration_since(Instant::now());
        // Boxed: a cold path, kept out of every call's future.
        let authenticating = Box::pin(self.inner.client.refresh_token());
        let answer = match tokio::time::timeout_at(deadline, authenticating).await {
            Ok(answer) => answer.map_err(|err| super::call::map_error("authenticate", None, err)),
            Err(_) if budget < timeout / 2 => return Err(timed_out()),
            Err(_) => Err(timed_out()),
        };
        match answer {
            Ok(()) => {
                self.inner.renewals.fetch_add(1, Ordering::Release);
                *last = None;
                tracing::debug!("authenticated again: the auth store changed");
                Ok(())
            }
            Err(err) => {
                tracing::debug!(%err, "could not authenticate again");
                let denied = match &err {
                    LockError::PermissionDenied { message, .. } => Some(message.clone()),
                    _ => None,
                };
                *last = Some(Failure {
                    seen,
                    at: Instant::now(),
                    denied,
                });
                Err(err)
            }
        }
    }
}

impl Failure {
    /// What a request that would have renewed the same token gets instead.
    fn error(&self) -> LockError {
        match &self.denied {
            Some(message) => LockError::PermissionDenied {
                backend: Backend::Etcd,
                operation: "authenticate",
                lock: None,
                message: message.clone(),
            },
            None => LockError::Backend {
                backend: Backend::Etcd,
                operation: "authenticate",
                lock: None,
                source: format!("authenticating again failed less than {FAILURE_HOLDS:?} ago")
                    .into(),
            },
        }
    }
}

impl TokenRenewal {
    /// After `refusal` ([`is_old_auth_revision`]) of a request sent having [`seen`](Self::seen)
    /// `seen`: `Ok` once the token is renewed (send it again), else what the request ends
    /// with ([`after_failed_renewal`]). The one rule of every call that renews.
    pub(crate) async fn resend_after(
        &self,
        refusal: LockError,
        seen: u64,
        timeout: Duration,
    ) -> Result<(), LockError> {
        tracing::debug!(%refusal, "auth token older than the auth store; renewing it");
        match self.renew(seen, timeout).await {
            Ok(()) => Ok(()),
            Err(renewing) => Err(after_failed_renewal(refusal, renewing)),
        }
    }
}

/// What a request refused for an old token (`refusal`) ends with when authenticating
/// again failed (`renewing`): credentials refused say why; anything else (no answer, no
/// leader) leaves the refusal, which proves the request was not applied (unlike a
/// timeout, which would leave it unknown).
fn after_failed_renewal(refusal: LockError, renewing: LockError) -> LockError {
    if renewing.is_permission_denied() {
        renewing
    } else {
        tracing::debug!(%renewing, "authenticating again failed; the refusal stands");
        refusal
    }
}

/// A renewal for a client that never connects (nothing listens at its endpoint, and
/// without credentials making one sends nothing), for unit tests of the calls.
#[cfg(test)]
pub(crate) async fn unused() -> TokenRenewal {
    let client = Client::connect(["http://127.0.0.1:1"], None)
        .await
        .expect("a client connects lazily");
    TokenRenewal::new(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;

    #[test]
    fn only_the_old_revision_refusal_is_one() {
        let refusal = |message: &str| {
            super::super::call::map_error(
                "acquire",
                Some("x"),
                etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(message)),
            )
        };
        assert!(is_old_auth_revision(&refusal(OLD_REVISION)));
        assert!(!is_old_auth_revision(&refusal(
            "etcdserver: duplicate key given in txn request"
        )));
        assert!(!is_old_auth_revision(&LockError::PermissionDenied {
            backend: Backend::Etcd,
            operation: "acquire",
            lock: None,
            message: OLD_REVISION.into(),
        }));
    }

    fn old_revision() -> Result<(), etcd_client::Error> {
        Err(etcd_client::Error::GRpcStatus(
            tonic::Status::invalid_argument(OLD_REVISION),
        ))
    }

    #[tokio::test]
    async fn a_refused_request_is_sent_again_after_one_renewal() {
        let renewal = unused().await;
        let mut sent = 0;
        let answer = super::super::call::call_retrying_noting(
            "acquire",
            Some("x"),
            Duration::from_secs(1),
            &renewal,
            || {
                sent += 1;
                std::future::ready(if sent == 1 { old_revision() } else { Ok(()) })
            },
        )
        .await;
        assert!(answer.result.is_ok(), "{:?}", answer.result);
        assert!(!answer.ambiguous, "the refusal proves it was not applied");
        assert_eq!((sent, renewal.seen()), (2, 1));
    }

    #[tokio::test]
    async fn refusals_after_every_renewal_end_the_call() {
        let renewal = unused().await;
        let mut sent = 0;
        let answer = super::super::call::call_renewing(
            "guarded txn",
            Some("x"),
            Duration::from_secs(1),
            &renewal,
            || {
                sent += 1;
                std::future::ready(old_revision())
            },
        )
        .await;
        let err = answer.expect_err("refused throughout");
        assert!(is_old_auth_revision(&err), "{err}");
        assert_eq!(sent, MAX_RENEWALS + 1);
    }

    #[tokio::test]
    async fn a_refusal_of_a_token_renewed_since_renews_nothing() {
        let renewal = unused().await;
        let seen = renewal.seen();
        renewal
            .renew(seen, Duration::from_secs(1))
            .await
            .expect("renewed");
        // A second request, sent with the same old token, is refused after that.
        renewal
            .renew(seen, Duration::from_secs(1))
            .await
            .expect("nothing to do");
        assert_eq!(renewal.seen(), seen + 1);
    }

    #[test]
    fn a_failed_renewal_leaves_the_refusal_unless_the_credentials_were_refused() {
        let refusal = || {
            super::super::call::map_error(
                "acquire",
                Some("x"),
                etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(OLD_REVISION)),
            )
        };
        let timed_out = LockError::Timeout {
            backend: Backend::Etcd,
            operation: "authenticate",
            lock: None,
            after: Duration::from_secs(1),
        };
        let kept = after_failed_renewal(refusal(), timed_out);
        assert!(is_old_auth_revision(&kept), "{kept}");
        assert!(!super::super::call::may_have_applied(&kept));
        let denied = LockError::PermissionDenied {
            backend: Backend::Etcd,
            operation: "authenticate",
            lock: None,
            message: "etcdserver: authentication failed".into(),
        };
        assert!(after_failed_renewal(refusal(), denied).is_permission_denied());
    }
}
