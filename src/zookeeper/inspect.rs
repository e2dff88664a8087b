//! Who holds which lock and who waits, read from the tree (`fencelock locks`).

use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use super::ZooKeeperLocker;
use super::contender::{ContenderKind, queue};
use super::error::RequestError;
use crate::{Backend, FencingToken, LockError, LockOptions, validate_name};

/// One lock's queue, first in line first: the holder, then the waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperLockState {
    /// The lock's name.
    pub name: String,
    /// Its contenders' nodes in queue order, whichever client made them (kazoo's and
    /// Curator's too); the first holds the lock.
    pub entries: Vec<ZooKeeperEntry>,
}

/// One contender's node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperEntry {
    /// The node's path.
    pub path: String,
    /// Its czxid: the token it holds (or will hold) the lock with.
    pub token: FencingToken,
    /// The session that owns the node (`ephemeralOwner`).
    pub session_id: i64,
    /// Whether it holds the lock: first in line, or a reader with no writer ahead.
    pub holds: bool,
    /// Whether it is a reader of the read-write lock of the same name (fencelock's,
    /// Curator's or kazoo's): readers share.
    pub reader: bool,
    /// Which recipe made the node, as far as its name tells.
    pub kind: ContenderKind,
}

impl ZooKeeperLocker {
    /// The queue of the lock `name` (empty if nobody holds or waits for it).
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn inspect(&self, name: &str) -> Result<ZooKeeperLockState, LockError> {
        validate_name(name)?;
        let fail = |err: RequestError| err.into_lock_error("inspect", Some(name));
        let session = self.session_for(&LockOptions::new()).await?;
        let dir = format!("{}/{name}", self.config().namespace);
        let listed = {
            let dir = dir.clone();
            session
                .call(|client| async move { client.get_children(&dir).await })
                .await
        };
        let (children, cversion) = match listed {
            Err(RequestError::Server(ZkError::NoNode)) => (Vec::new(), 0),
            other => other
                .map(|(children, parent)| (children, parent.cversion))
                .map_err(fail)?,
        };
        let contenders =
            queue(children, cversion).map_err(|recipe| LockError::IncompatibleRecipe {
                backend: Backend::ZooKeeper,
                lock: name.to_owned(),
                recipe: recipe.describe(),
            })?;
        let mut entries = Vec::new();
        // Whether a node that does not share with readers was seen yet.
        let mut exclusive_ahead = false;
        for contender in contenders {
            let exclusive = !contender.kind.shares_with_readers();
            let path = format!("{dir}/{}", contender.name);
            let stat = {
                let path = path.clone();
                session
                    .call(|client| async move { client.check_stat(&path).await })
                    .await
                    .map_err(fail)?
            };
            // Gone between the listing and now: no longer in the queue.
            let Some(stat) = stat else { continue };
            // First in line, or a reader with no writer ahead (readers share).
            let holds = entries.is_empty() || (!exclusive && !exclusive_ahead);
            exclusive_ahead |= exclusive;
            entries.push(ZooKeeperEntry {
                holds,
                reader: !exclusive,
                kind: contender.kind,
                path,
                token: FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0)),
                session_id: stat.ephemeral_owner,
            });
        }
        Ok(ZooKeeperLockState {
            name: name.to_owned(),
            entries,
        })
    }

    /// A zxid the ensemble assigns now: the `czxid` of a probe node created (and deleted
    /// at once) under the namespace, so a write through the leader. Every later grant's
    /// token is larger. A token storage has seen that is not below it means the
    /// ensemble's history is behind that token (a data dir restored from an older copy,
    /// or wiped; a standalone server with `forceSync=no` that crashed): until the zxids
    /// pass it, every grant carries a token storage has seen (`fencelock locks
    /// --newest-token` checks it; docs/zookeeper.md).
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn current_zxid(&self) -> Result<FencingToken, LockError> {
        let fail = |err: RequestError| err.into_lock_error("current zxid", None);
        let session = self.session_for(&LockOptions::new()).await?;
        let namespace = &self.config().namespace;
        let probe = format!("{namespace}/fencelock-zxid-probe-");
        let mut made_namespace = false;
        let (stat, sequence) = loop {
            let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
            let probe = probe.as_str();
            let created = session
                .call(|client| async move { client.create(probe, b"", &options).await })
                .await;
            match created {
                Err(RequestError::Server(ZkError::NoNode)) if !made_namespace => {
                    made_namespace = true;
                    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    let made = session
                        .call(|client| async move { client.mkdir(namespace, &options).await })
                        .await;
                    match made {
                        Ok(()) | Err(RequestError::Server(ZkError::NodeExists)) => {}
                        Err(err) => return Err(fail(err)),
                    }
                }
                created => break created.map_err(fail)?,
            }
        };
        let path = format!("{probe}{sequence}");
        // Ephemeral: a delete that fails goes with the session.
        let _ = super::node::delete(&session, path).await;
        u64::try_from(stat.czxid)
            .map(FencingToken::new)
            .map_err(|_| LockError::Backend {
                backend: Backend::ZooKeeper,
                operation: "current zxid",
                lock: None,
                source: format!("the server reported czxid {}", stat.czxid).into(),
            })
    }

    /// The queues of every lock of the namespace that has one, by name.
    pub async fn inspect_all(&self) -> Result<Vec<ZooKeeperLockState>, LockError> {
        let session = self.session_for(&LockOptions::new()).await?;
        let namespace = self.config().namespace.clone();
        let listed = session
            .call(|client| async move { client.list_children(&namespace).await })
            .await;
        let mut names = match listed {
            Err(RequestError::Server(ZkError::NoNode)) => Vec::new(),
            other => other.map_err(|err| err.into_lock_error("inspect", None))?,
        };
        names.sort();
        let mut states = Vec::new();
        for name in names.iter().filter(|name| validate_name(name).is_ok()) {
            let state = self.inspect(name).await?;
            if !state.entries.is_empty() {
                states.push(state);
            }
        }
        Ok(states)
    }
}
