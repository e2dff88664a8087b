//! Who holds which lock and who waits, read from the tree (`fencelock locks`).

use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use super::ZooKeeperLocker;
use super::contender::{Contender, ContenderKind, Incompatible, queue};
use super::error::RequestError;
use super::session::Session;
use crate::{Backend, FencingToken, HolderInfo, LockError, LockOptions, validate_name};

/// One lock's queue, first in line first: the holder, then the waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperLockState {
    /// The lock's name.
    pub name: String,
    /// Its contenders' nodes in queue order, whichever client made them (kazoo's and
    /// Curator's too); the first holds the lock.
    pub entries: Vec<ZooKeeperEntry>,
    /// The other client's recipe that uses this path in a way fencelock cannot queue
    /// beside (a semaphore): its acquisitions are refused
    /// ([`LockError::IncompatibleRecipe`]), and `entries` is empty.
    pub incompatible: Option<&'static str>,
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
    /// Who made it, from the holder record in its data (fencelock's nodes).
    pub holder: Option<HolderInfo>,
    /// Its data when it is not a holder record, as text (lossy UTF-8): kazoo's
    /// identifier, Curator's address; `None` when empty.
    pub data: Option<String>,
}

/// The contenders under the lock's node `dir`, in queue order (none if it does not
/// exist), or the other client's recipe that makes the path unusable.
pub(super) async fn queue_of(
    session: &Session,
    dir: &str,
) -> Result<Result<Vec<Contender>, Incompatible>, RequestError> {
    let listed = session
        .call(|client| async move { client.get_children(dir).await })
        .await;
    Ok(match listed {
        Err(RequestError::Server(ZkError::NoNode)) => Ok(Vec::new()),
        other => {
            let (children, parent) = other?;
            queue(children, parent.cversion)
        }
    })
}

impl ZooKeeperLocker {
    /// The queue of the lock `name` (empty if nobody holds or waits for it; empty with
    /// [`incompatible`](ZooKeeperLockState::incompatible) set if another client's
    /// semaphore uses its path).
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn inspect(&self, name: &str) -> Result<ZooKeeperLockState, LockError> {
        validate_name(name)?;
        let fail = |err: RequestError| err.into_lock_error("inspect", Some(name));
        let session = self.session_for(&LockOptions::new()).await?;
        let dir = format!("{}/{name}", self.config().namespace);
        let contenders = match queue_of(&session, &dir).await.map_err(fail)? {
            Ok(contenders) => contenders,
            Err(recipe) => {
                return Ok(ZooKeeperLockState {
                    name: name.to_owned(),
                    entries: Vec::new(),
                    incompatible: Some(recipe.describe()),
                });
            }
        };
        let mut entries = Vec::new();
        // Whether a node that does not share with readers was seen yet.
        let mut exclusive_ahead = false;
        for contender in contenders {
            let exclusive = !contender.kind.shares_with_readers();
            let path = format!("{dir}/{}", contender.name);
            let read = {
                let path = path.clone();
                session
                    .call(|client| async move { client.get_data(&path).await })
                    .await
            };
            let (data, stat) = match read {
                Ok(read) => read,
                // Gone between the listing and now: no longer in the queue.
                Err(RequestError::Server(ZkError::NoNode)) => continue,
                Err(err) => return Err(fail(err)),
            };
            let holder = HolderInfo::decode(&data);
            // First in line, or a reader with no writer ahead (readers share).
            let holds = entries.is_empty() || (!exclusive && !exclusive_ahead);
            exclusive_ahead |= exclusive;
            let data = (holder.is_none() && !data.is_empty())
                .then(|| String::from_utf8_lossy(&data).into_owned());
            entries.push(ZooKeeperEntry {
                holds,
                reader: !exclusive,
                kind: contender.kind,
                holder,
                data,
                path,
                token: FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0)),
                session_id: stat.ephemeral_owner,
            });
        }
        Ok(ZooKeeperLockState {
            name: name.to_owned(),
            entries,
            incompatible: None,
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
            if !state.entries.is_empty() || state.incompatible.is_some() {
                states.push(state);
            }
        }
        Ok(states)
    }
}
