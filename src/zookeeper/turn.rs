//! Waiting for one's turn in one lock's queue: behind the contender just ahead (or, for
//! a reader, the last one ahead that does not share with readers), watched alone, with
//! the queue read again each time it goes.

use zookeeper_client::Error as ZkError;

use super::contender::{Contender, queue};
use super::error::RequestError;
use super::node::{Mark, NodeRef};
use super::session::Session;
use crate::{Backend, LockError, LossReason};

/// The children of a lock's node and its `cversion`, from one answer.
pub(crate) type Listing = (Vec<String>, i32);

/// Where an acquisition stands in a queue once it is looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Nothing ahead keeps it from holding the lock.
    Granted,
    /// Someone ahead holds or waits, and the caller asked not to wait.
    Behind,
}

/// Waits (if `wait`) until the acquisition's node (`node.path`, of kind `mark`) may hold
/// lock `name`; `listed` is the queue as it stood right after the create, if known.
///
/// The order never reverses (a node is only ever joined behind the ones there), so a
/// node granted once stays granted until it goes: an acquisition of several locks waits
/// in each queue in turn.
///
/// # Cancel safety
///
/// Cancel safe: it only reads, watches and deletes a second node of this very
/// acquisition; the caller's entry removes the node if the wait is dropped.
pub(crate) async fn await_turn(
    session: &Session,
    name: &str,
    node: &NodeRef,
    mark: Mark,
    wait: bool,
    mut listed: Option<Listing>,
) -> Result<Turn, LockError> {
    let fail = |err: RequestError| err.into_lock_error("wait", Some(name));
    let dir = node.dir.as_str();
    let mine = node
        .path
        .as_deref()
        .and_then(|path| path.rsplit('/').next())
        .unwrap_or_default();
    loop {
        let (children, cversion) = match listed.take() {
            Some(listed) => listed,
            None => patiently(
                session,
                |client| async move { client.get_children(dir).await },
            )
            .await
            .map(|(children, parent)| (children, parent.cversion))
            .map_err(fail)?,
        };
        let contenders =
            queue(children, cversion).map_err(|recipe| LockError::IncompatibleRecipe {
                backend: Backend::ZooKeeper,
                lock: name.to_owned(),
                recipe: recipe.describe(),
            })?;
        // A node with our id that is not ours: a create whose outcome was unknown, found
        // missing, and applied after all. It would queue us behind ourselves for as long
        // as the session lives: remove it (the next listing shows it gone).
        if let Some(orphan) = contenders
            .iter()
            .find(|child| child.name.starts_with(&node.id) && child.name != mine)
        {
            let orphan = format!("{dir}/{}", orphan.name);
            tracing::warn!(%orphan, "removing a second node of this acquisition");
            super::node::delete(session, orphan).await.map_err(fail)?;
            continue;
        }
        let Some(place) = contenders.iter().position(|child| child.name == mine) else {
            // Our node is gone: deleted by someone, or the session ended.
            let reason = session.loss.current().unwrap_or(LossReason::KeyDeleted);
            return Err(LockError::LeaseLost {
                lock: Some(name.to_owned()),
                reason,
            });
        };
        // Whom we wait for: the node just before ours; for a reader, the last node
        // before ours that does not share with readers (a writer, a mutex contender,
        // kazoo's lock, a node of a recipe we do not know).
        let blocker = if mark.excludes_readers() {
            place.checked_sub(1)
        } else {
            contenders[..place]
                .iter()
                .rposition(|child: &Contender| !child.kind.shares_with_readers())
        };
        let Some(blocker) = blocker else {
            if !session.usable() {
                let reason = session.loss.current().unwrap_or(LossReason::Expired);
                return Err(LockError::LeaseLost {
                    lock: Some(name.to_owned()),
                    reason,
                });
            }
            return Ok(Turn::Granted);
        };
        if !wait {
            return Ok(Turn::Behind);
        }
        // Watch only the blocker: one waiter wakes per release (no herd; the readers
        // behind one writer wake together).
        let predecessor = format!("{dir}/{}", contenders[blocker].name);
        let predecessor = predecessor.as_str();
        let watched = patiently(session, |client| async move {
            client.check_and_watch_stat(predecessor).await
        })
        .await
        .map_err(fail)?;
        let (Some(_), watcher) = watched else {
            continue;
        };
        tokio::select! {
            _ = watcher.changed() => {}
            reason = session.loss.wait() => {
                return Err(LockError::LeaseLost { lock: Some(name.to_owned()), reason });
            }
        }
    }
}

/// Runs a read until it is answered, while the session lives: a read is safe to repeat,
/// and a connection that broke (a member that died, a leader election) comes back
/// within the session timeout if the session is to survive at all.
pub(crate) async fn patiently<T, F, Fut>(session: &Session, read: F) -> Result<T, RequestError>
where
    F: Fn(zookeeper_client::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, ZkError>>,
{
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        match session.call(&read).await {
            Err(err) if err.outcome_unknown() && session.usable() => {
                tracing::debug!(%err, "a read failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            answer => return answer,
        }
    }
}
