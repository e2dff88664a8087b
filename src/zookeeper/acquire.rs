//! One acquisition: join the queue, wait behind the predecessor, or leave cleanly.

use std::sync::Arc;

use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use super::contender::{Contender, queue};
use super::error::RequestError;
use super::guard::ZooKeeperGuard;
use super::node::{Mark, NodeRef, protected_id};
use super::session::Session;
use crate::{Backend, FencingToken, LockError, LossReason};

/// Our node while the acquisition runs: removed (in the background) if the acquisition
/// ends without a guard, found by its id if the create's answer never came.
struct Entry {
    session: Arc<Session>,
    node: NodeRef,
    armed: bool,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.armed {
            self.node.clone().remove_in_background(self.session.clone());
        }
    }
}

/// How many times a create is tried again after its outcome turned out unknown (and our
/// node was not found), or after the lock's node vanished between the `mkdir` and the
/// create (a container node the server removed when it was empty).
const CREATE_ATTEMPTS: usize = 5;

/// Joins the queue of `name` in `session` and waits (`wait`) or not for the lock.
///
/// # Cancel safety
///
/// Cancel safe. Requests are sent when they are made, so once the create is made the
/// node may exist: from then on an armed [`Entry`] removes it if this future is dropped,
/// finding it by its protected-mode id if the create's answer never came. The removal
/// queues behind the create in the session, and is retried until confirmed or the
/// session is gone (which removes the node).
#[tracing::instrument(skip(session, namespace), fields(backend = "zookeeper", session = format_args!("{:#x}", session.id)))]
pub(crate) async fn acquire(
    session: Arc<Session>,
    namespace: &str,
    name: &str,
    mark: Mark,
    wait: bool,
) -> Result<Option<ZooKeeperGuard>, LockError> {
    let fail = |err: RequestError, operation| err.into_lock_error(operation, Some(name));
    let dir = format!("{namespace}/{name}");
    let mut entry = Entry {
        session: session.clone(),
        node: NodeRef {
            dir: dir.clone(),
            id: protected_id(),
            path: None,
            ambiguous: false,
        },
        armed: true,
    };
    let (path, token, mut children) = join(&session, &mut entry.node, mark)
        .await
        .map_err(|err| fail(err, "acquire"))?;
    entry.node.path = Some(path.clone());
    let mine = path.rsplit('/').next().unwrap_or_default().to_owned();
    loop {
        let (children, cversion) = match children.take() {
            Some(listed) => listed,
            None => {
                let dir = dir.clone();
                patiently(&session, move |client| {
                    let dir = dir.clone();
                    async move { client.get_children(&dir).await }
                })
                .await
                .map(|(children, parent)| (children, parent.cversion))
                .map_err(|e| fail(e, "wait"))?
            }
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
            .find(|child| child.name.starts_with(&entry.node.id) && child.name != mine)
        {
            let orphan = format!("{dir}/{}", orphan.name);
            tracing::warn!(%orphan, "removing a second node of this acquisition");
            match super::node::delete(&session, orphan).await {
                Ok(()) => continue,
                Err(err) => return Err(fail(err, "wait")),
            }
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
            entry.armed = false;
            let guard = ZooKeeperGuard::new(
                session.clone(),
                name.to_owned(),
                entry.node.clone(),
                path,
                token,
            );
            return Ok(Some(guard));
        };
        if !wait {
            // Leave the queue before answering, so that the caller's next attempt does
            // not find this one ahead of it. On failure the entry retries in the
            // background.
            if entry.node.remove(&session).await.is_ok() {
                entry.armed = false;
            }
            return Ok(None);
        }
        // Watch only the blocker: one waiter wakes per release (no herd; the readers
        // behind one writer wake together).
        let predecessor = format!("{dir}/{}", contenders[blocker].name);
        let watched = patiently(&session, move |client| {
            let predecessor = predecessor.clone();
            async move { client.check_and_watch_stat(&predecessor).await }
        })
        .await
        .map_err(|err| fail(err, "wait"))?;
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

/// The children of a lock's node and its `cversion`, from one answer.
type Listing = (Vec<String>, i32);

/// Creates our node (the lock's node first if it is missing), with the queue as it
/// stands right after the create when the answer came (`None` if it must be read).
/// Returns the node's path and its czxid.
///
/// A create whose outcome is unknown marks the node ambiguous (its removal looks for
/// every node with its id) and retires the session: a create applied later than the
/// lookup that did not find it (which ZooKeeper's `SessionMoved` rule rules out, except
/// through an observer master) would otherwise queue a node nobody owns, under a
/// session that lives on; once the session's last lock is gone it is closed, and such a
/// node with it.
async fn join(
    session: &Session,
    node: &mut NodeRef,
    mark: Mark,
) -> Result<(String, FencingToken, Option<Listing>), RequestError> {
    let prefix = format!("{}/{}{}", node.dir, node.id, mark.as_str());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let client = session.client()?;
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        // Both requests are sent now, in this order, on one session: the listing sees
        // the create. One round trip for both.
        let create = client.create(&prefix, b"", &options);
        let listing = client.get_children(&node.dir);
        let timeout = session.request_timeout;
        let (created, listed) = tokio::join!(
            super::error::timed(timeout, create),
            super::error::timed(timeout, listing)
        );
        match created {
            Ok((stat, sequence)) => {
                let path = format!("{prefix}{sequence}");
                let listed = listed
                    .ok()
                    .map(|(children, parent)| (children, parent.cversion));
                return Ok((path, czxid(stat.czxid)?, listed));
            }
            Err(RequestError::Server(ZkError::NoNode)) if attempts < CREATE_ATTEMPTS => {
                let dir = node.dir.clone();
                let mkdir = session
                    .call(|client| async move {
                        let options = CreateMode::Container.with_acls(Acls::anyone_all());
                        client.mkdir(&dir, &options).await
                    })
                    .await;
                match mkdir {
                    Ok(()) | Err(RequestError::Server(ZkError::NodeExists)) => {}
                    Err(err) => return Err(err),
                }
            }
            Err(err) if err.outcome_unknown() && attempts < CREATE_ATTEMPTS => {
                // Protected mode: the create may have been applied. Look for it.
                node.ambiguous = true;
                session.retire();
                if let Some(path) = find_patiently(session, node).await? {
                    let stat_path = path.clone();
                    let stat = session
                        .call(|client| async move { client.check_stat(&stat_path).await })
                        .await?;
                    let Some(stat) = stat else {
                        return Err(RequestError::Server(ZkError::NoNode));
                    };
                    return Ok((path, czxid(stat.czxid)?, None));
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Looks for our node until an answer comes, while the session lives: a connection
/// that broke once is likely to break the first look too.
async fn find_patiently(session: &Session, node: &NodeRef) -> Result<Option<String>, RequestError> {
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        match node
            .find_all(session)
            .await
            .map(|found| found.into_iter().next())
        {
            Err(err) if err.outcome_unknown() && session.usable() => {
                tracing::debug!(%err, "looking for our node failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
            found => return found,
        }
    }
}

/// Runs a read until it is answered, while the session lives: a read is safe to repeat,
/// and a connection that broke (a member that died, a leader election) comes back
/// within the session timeout if the session is to survive at all.
async fn patiently<T, F, Fut>(session: &Session, read: F) -> Result<T, RequestError>
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

fn czxid(zxid: i64) -> Result<FencingToken, RequestError> {
    u64::try_from(zxid)
        .ok()
        .filter(|z| *z > 0)
        .map(FencingToken::new)
        .ok_or_else(|| {
            RequestError::Server(ZkError::UnexpectedError(format!(
                "the server reported czxid {zxid} for a node it created"
            )))
        })
}
