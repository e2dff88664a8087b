//! The guard of a ZooKeeper lock, and the task that follows its node.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Error as ZkError, EventType, SessionState};

use super::node::NodeRef;
use super::session::Session;
use crate::loss::{LossNotifier, LossWatch, loss_channel};
use crate::metrics::{self, Holding, Release};
use crate::{Backend, FencingToken, LockError, LockGuard, LossReason, ReleaseOutcome};

/// A held ZooKeeper lock: the first node in `<namespace>/<name>/`.
///
/// Its token is the node's `czxid`, the id of the transaction that created it: assigned
/// by ZooKeeper's atomic broadcast, larger than every transaction before it across the
/// whole ensemble and across leader changes, and never handed out twice. The node's
/// sequence number is not used: it counts per parent node and starts again at zero when
/// the parent is deleted and created again (see the module documentation).
#[must_use = "dropping the guard releases the lock at once"]
pub struct ZooKeeperGuard {
    session: Arc<Session>,
    name: String,
    node: NodeRef,
    path: String,
    token: FencingToken,
    loss: LossWatch,
    follow: tokio::task::JoinHandle<()>,
    released: bool,
    holding: Option<Holding>,
}

impl std::fmt::Debug for ZooKeeperGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperGuard")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("token", &self.token)
            .field("session", &self.session)
            .field("lost", &self.loss.current())
            .finish_non_exhaustive()
    }
}

impl ZooKeeperGuard {
    pub(crate) fn new(
        session: Arc<Session>,
        name: String,
        node: NodeRef,
        path: String,
        token: FencingToken,
    ) -> Self {
        let (notifier, loss) = loss_channel(Backend::ZooKeeper);
        let follow = tokio::spawn(follow(session.clone(), path.clone(), notifier));
        let holding = Some(loss.holding());
        Self {
            session,
            name,
            node,
            path,
            token,
            loss,
            follow,
            released: false,
            holding,
        }
    }

    /// The lock node's path, `<namespace>/<name>/_c_<id>-lock-<sequence>`.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Stops the session's monitor as a panic in it would (for tests: the loss must
    /// still be reported and the session closed).
    #[doc(hidden)]
    pub fn stop_session_monitor_for_test(&self) {
        self.session.stop_monitor_for_test();
    }

    /// The ZooKeeper session the node lives in (its id, as ZooKeeper's four-letter
    /// commands and logs show it in hex).
    #[must_use]
    pub fn session_id(&self) -> i64 {
        self.session.id
    }

    /// The session timeout the server granted: how long the lock outlives a holder that
    /// went silent.
    #[must_use]
    pub fn session_timeout(&self) -> Duration {
        self.session.timeout
    }

    fn gone(&self) -> bool {
        self.released || self.loss.current().is_some() || self.session.clock.has_passed()
    }

    fn detach(&mut self) {
        self.released = true;
        self.holding = None;
        self.follow.abort();
    }
}

/// Marks the guard's loss: the session is lost, or the node is deleted under it (an
/// operator, a late delete).
async fn follow(session: Arc<Session>, path: String, notifier: LossNotifier) {
    let reason = tokio::select! {
        reason = session.loss.wait() => reason,
        reason = node_deleted(&session, &path) => reason,
    };
    notifier.mark(reason);
}

/// Watches the node until it is deleted; session-level trouble is left to the session.
async fn node_deleted(session: &Session, path: &str) -> LossReason {
    loop {
        let watched = match session.client() {
            Ok(client) => client.check_and_watch_stat(path).await,
            Err(_) => Err(ZkError::ClientClosed),
        };
        match watched {
            Ok((None, _)) | Err(ZkError::NoNode) => return LossReason::KeyDeleted,
            Ok((Some(_), watcher)) => {
                let event = watcher.changed().await;
                match (event.event_type, event.session_state) {
                    (EventType::NodeDeleted, _) => return LossReason::KeyDeleted,
                    (_, SessionState::Expired | SessionState::Closed) => {
                        return std::future::pending().await;
                    }
                    _ => {}
                }
            }
            // Connection trouble: the session's deadline decides; look again shortly.
            Err(ZkError::SessionExpired | ZkError::ClientClosed) => {
                return std::future::pending().await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

impl LockGuard for ZooKeeperGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn lost(&self) -> LossReason {
        self.loss.wait().await
    }

    fn is_held(&self) -> bool {
        !self.gone()
    }

    fn lease_remaining(&self) -> Option<Duration> {
        Some(if self.gone() {
            Duration::ZERO
        } else {
            self.session.clock.remaining()
        })
    }

    #[tracing::instrument(skip(self), fields(backend = "zookeeper", lock = %self.name, token = %self.token))]
    async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        let lost_before = self.gone();
        // The hold ends here, before the delete: the node's own deletion must not reach
        // the follower as a loss (it did, now and then, and was counted in
        // `fencelock_losses_total` as `key_deleted`: tests/metrics/zookeeper.rs). Not
        // `detach()`: a release dropped mid-delete must still leave `Drop` to remove the
        // node in the background.
        self.holding = None;
        self.follow.abort();
        let path = self.path.clone();
        let deleted = self
            .session
            .call(|client| async move { client.delete(&path, None).await })
            .await;
        self.detach();
        if self.node.ambiguous {
            // Another node with our id may exist (a create applied late): look for it.
            self.node.clone().remove_in_background(self.session.clone());
        }
        let outcome = match deleted {
            Ok(()) if !lost_before => Ok(ReleaseOutcome::Released),
            Ok(()) | Err(super::error::RequestError::Server(ZkError::NoNode)) => {
                Ok(ReleaseOutcome::NotHeld)
            }
            Err(err) if err.session_gone().is_some() => Ok(ReleaseOutcome::NotHeld),
            Err(err) => {
                // The delete may or may not be applied: make sure, in the background.
                self.node.clone().remove_in_background(self.session.clone());
                Err(err.into_lock_error("release", Some(&self.name)))
            }
        };
        let counted = match &outcome {
            Ok(ReleaseOutcome::Released | ReleaseOutcome::Unconfirmed) => Release::Released,
            Ok(ReleaseOutcome::NotHeld) => Release::NotHeld,
            Err(err) => {
                metrics::error(Backend::ZooKeeper, "release", err);
                Release::Failed
            }
        };
        metrics::release(Backend::ZooKeeper, counted);
        outcome
    }
}

impl Drop for ZooKeeperGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        metrics::release(Backend::ZooKeeper, Release::Dropped);
        self.detach();
        self.node.clone().remove_in_background(self.session.clone());
    }
}
