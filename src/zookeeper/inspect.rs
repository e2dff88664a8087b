//! Who holds which lock and who waits, read from the tree (`fencelock locks`).

use zookeeper_client::Error as ZkError;

use super::ZooKeeperLocker;
use super::error::RequestError;
use super::node::{parse, queue};
use crate::{FencingToken, LockError, LockOptions, validate_name};

/// One lock's queue, first in line first: the holder, then the waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperLockState {
    /// The lock's name.
    pub name: String,
    /// Its contenders' nodes in queue order; the first holds the lock.
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
    /// Whether it is a reader of the read-write lock of the same name.
    pub reader: bool,
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
                .call(|client| async move { client.list_children(&dir).await })
                .await
        };
        let children = match listed {
            Err(RequestError::Server(ZkError::NoNode)) => Vec::new(),
            other => other.map_err(fail)?,
        };
        let mut entries = Vec::new();
        // Whether an exclusive node (a lock contender, a writer) was seen yet.
        let mut exclusive_ahead = false;
        for child in queue(children) {
            let exclusive = parse(&child).is_none_or(|(mark, _)| mark.excludes_readers());
            let path = format!("{dir}/{child}");
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
