//! A read-write lock on etcd: readers share, writers exclude, FIFO by create revision.

use super::acquire::Mode;
use super::kind::Kind;
use super::{EtcdGuard, EtcdLocker};
use crate::{Backend, LockError, LockOptions, validate_name};

/// Readers share the lock, a writer holds it alone; see [`EtcdLocker::rwlock`].
///
/// Keys queue by create revision: a writer waits for every key ahead of it, a reader only
/// for the writers ahead of it, so a waiting writer holds back the readers that arrive
/// after it and writers never starve. Each side's guard is an [`EtcdGuard`] with its own
/// fencing token; storage that must order writers against readers can compare them.
/// Readers share only with readers: any other key under the same name (a lock, a
/// semaphore permit, Go's `etcdctl lock`) counts as a writer.
///
/// ```no_run
/// use fencelock::etcd::{EtcdConfig, EtcdLocker};
/// use fencelock::LockOptions;
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// let catalog = locks.rwlock("catalog")?;
/// let reading = catalog.read(&LockOptions::new()).await?; // others may read too
/// drop(reading);
/// let writing = catalog.write(&LockOptions::new()).await?; // alone
/// # drop(writing);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EtcdRwLock {
    locker: EtcdLocker,
    name: String,
}

impl EtcdRwLock {
    pub(super) fn new(locker: EtcdLocker, name: &str) -> Result<Self, LockError> {
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
    /// Cancel safe: a dropped or timed-out wait leaves no key behind.
    #[tracing::instrument(skip(self, options), fields(backend = "etcd", rwlock = %self.name))]
    pub async fn read(&self, options: &LockOptions) -> Result<EtcdGuard, LockError> {
        self.wait(options, Self::reader()).await
    }

    /// Takes the lock for writing, waiting behind everyone that arrived first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read).
    #[tracing::instrument(skip(self, options), fields(backend = "etcd", rwlock = %self.name))]
    pub async fn write(&self, options: &LockOptions) -> Result<EtcdGuard, LockError> {
        self.wait(options, Self::writer()).await
    }

    /// Reads if no writer holds or waits ahead, else `None` at once.
    pub async fn try_read(&self, options: &LockOptions) -> Result<Option<EtcdGuard>, LockError> {
        self.locker
            .acquire(&self.name, options, Mode::Try, Self::reader())
            .await
    }

    /// Writes if nobody holds or waits, else `None` at once.
    pub async fn try_write(&self, options: &LockOptions) -> Result<Option<EtcdGuard>, LockError> {
        self.locker
            .acquire(&self.name, options, Mode::Try, Self::writer())
            .await
    }

    fn reader() -> Kind {
        Kind::Reader
    }

    fn writer() -> Kind {
        Kind::Writer
    }

    async fn wait(&self, options: &LockOptions, kind: Kind) -> Result<EtcdGuard, LockError> {
        let mode = Mode::Wait {
            timeout: options.wait_timeout(),
        };
        self.locker
            .acquire(&self.name, options, mode, kind)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: Backend::Etcd,
                operation: "acquire",
                lock: Some(self.name.clone()),
                source: "a waiting acquisition returned without the lock".into(),
            })
    }
}
