//! A read-write lock on ZooKeeper: readers share, writers exclude, FIFO by sequence.

use super::ZooKeeperGuard;
use super::ZooKeeperLocker;
use super::node::Mark;
use crate::{Backend, LockError, LockOptions, validate_name};

/// Readers share the lock, a writer holds it alone; see [`ZooKeeperLocker::rwlock`].
///
/// Curator's `InterProcessReadWriteLock` recipe, with its node names
/// (`_c_<uuid>-__READ__<sequence>`, `_c_<uuid>-__WRIT__<sequence>`) in the same queue as
/// the lock of the same name: a writer waits for every node ahead of it, a reader only
/// for the last writer (or lock contender) ahead of it, so a waiting writer holds back
/// the readers that arrive after it and writers never starve. Each guard carries its
/// node's czxid as its token; storage that must order writers against readers can
/// compare them.
///
/// ```no_run
/// use fencelock::LockOptions;
/// use fencelock::zookeeper::{ZooKeeperConfig, ZooKeeperLocker};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = ZooKeeperLocker::connect(ZooKeeperConfig::new("127.0.0.1:2181")).await?;
/// let catalog = locks.rwlock("catalog")?;
/// let reading = catalog.read(&LockOptions::new()).await?; // others may read too
/// drop(reading);
/// let writing = catalog.write(&LockOptions::new()).await?; // alone
/// # drop(writing);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ZooKeeperRwLock {
    locker: ZooKeeperLocker,
    name: String,
}

impl ZooKeeperRwLock {
    pub(super) fn new(locker: ZooKeeperLocker, name: &str) -> Result<Self, LockError> {
        validate_name(name)?;
        Ok(Self {
            locker,
            name: name.to_owned(),
        })
    }

    /// Takes the lock for reading, waiting behind any writer that arrived first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped or timed-out wait leaves no node behind (removed in the
    /// background, found by its protected id if need be).
    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper", rwlock = %self.name))]
    pub async fn read(&self, options: &LockOptions) -> Result<ZooKeeperGuard, LockError> {
        self.wait(options, Mark::Read).await
    }

    /// Takes the lock for writing, waiting behind everyone that arrived first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read).
    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper", rwlock = %self.name))]
    pub async fn write(&self, options: &LockOptions) -> Result<ZooKeeperGuard, LockError> {
        self.wait(options, Mark::Write).await
    }

    /// Takes the lock for reading if no writer holds it or waits for it; `Ok(None)`
    /// otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read).
    pub async fn try_read(
        &self,
        options: &LockOptions,
    ) -> Result<Option<ZooKeeperGuard>, LockError> {
        self.locker
            .acquire(&self.name, options, Mark::Read, false)
            .await
    }

    /// Takes the lock for writing if nobody holds it or waits for it; `Ok(None)`
    /// otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read).
    pub async fn try_write(
        &self,
        options: &LockOptions,
    ) -> Result<Option<ZooKeeperGuard>, LockError> {
        self.locker
            .acquire(&self.name, options, Mark::Write, false)
            .await
    }

    async fn wait(&self, options: &LockOptions, mark: Mark) -> Result<ZooKeeperGuard, LockError> {
        self.locker
            .acquire(&self.name, options, mark, true)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: Backend::ZooKeeper,
                operation: "acquire",
                lock: Some(self.name.clone()),
                source: "a waiting acquisition returned without the lock".into(),
            })
    }
}
