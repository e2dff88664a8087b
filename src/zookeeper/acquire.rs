//! One acquisition: join the queue, wait behind the predecessor, or leave cleanly.

use std::sync::Arc;

use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use super::error::RequestError;
use super::guard::ZooKeeperGuard;
use super::node::{Mark, NodeRef, protected_id};
use super::session::Session;
use super::turn::{Listing, Turn, await_turn};
use crate::{FencingToken, LockError};

/// Our node while the acquisition runs: removed (in the background) if the acquisition
/// ends without a guard, found by its id if the create's answer never came.
pub(super) struct Entry {
    pub(super) session: Arc<Session>,
    pub(super) node: NodeRef,
    pub(super) armed: bool,
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
pub(super) const CREATE_ATTEMPTS: usize = 5;

/// Joins the queue of `name` in `session` and waits (`wait`) or not for the lock.
///
/// # Cancel safety
///
/// Cancel safe. Requests are sent when they are made, so once the create is made the
/// node may exist: from then on an armed [`Entry`] removes it if this future is dropped,
/// finding it by its protected-mode id if the create's answer never came. The removal
/// queues behind the create in the session, and is retried until confirmed or the
/// session is gone (which removes the node).
#[tracing::instrument(skip(session, namespace, holder), fields(backend = "zookeeper", session = format_args!("{:#x}", session.id)))]
pub(crate) async fn acquire(
    session: Arc<Session>,
    namespace: &str,
    name: &str,
    mark: Mark,
    wait: bool,
    holder: &[u8],
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
    let (path, token, children) = join(&session, &mut entry.node, mark, holder)
        .await
        .map_err(|err| fail(err, "acquire"))?;
    entry.node.path = Some(path.clone());
    match await_turn(&session, name, &entry.node, mark, wait, children).await? {
        Turn::Granted => {
            entry.armed = false;
            Ok(Some(ZooKeeperGuard::new(
                session.clone(),
                name.to_owned(),
                entry.node.clone(),
                path,
                token,
            )))
        }
        Turn::Behind => {
            // Leave the queue before answering, so that the caller's next attempt does
            // not find this one ahead of it. On failure the entry retries in the
            // background.
            if entry.node.remove(&session).await.is_ok() {
                entry.armed = false;
            }
            Ok(None)
        }
    }
}

/// Creates our node (the lock's node first if it is missing), holding `holder` as its
/// data, with the queue as it
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
    holder: &[u8],
) -> Result<(String, FencingToken, Option<Listing>), RequestError> {
    let prefix = format!("{}/{}{}", node.dir, node.id, mark.as_str());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let client = session.client()?;
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        // Both requests are sent now, in this order, on one session: the listing sees
        // the create. One round trip for both.
        // The node's data is the holder record (`HolderInfo`), as kazoo and Curator put
        // an identifier there: one create either way.
        let create = client.create(&prefix, holder, &options);
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
            Err(err) if err.outcome_unknown() => {
                // Protected mode: the create may have been applied (the last one too,
                // which is not looked for: the entry's removal sweeps for it).
                node.ambiguous = true;
                session.retire();
                if attempts >= CREATE_ATTEMPTS {
                    return Err(err);
                }
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
pub(super) async fn find_patiently(
    session: &Session,
    node: &NodeRef,
) -> Result<Option<String>, RequestError> {
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

pub(super) fn czxid(zxid: i64) -> Result<FencingToken, RequestError> {
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
