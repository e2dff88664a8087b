//! The ZooKeeper lock behind the common trait, and the sessions it runs on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::acquire::acquire;
use super::multi::{MAX_LOCK_ALL, ZooKeeperMultiGuard, acquire_all};
use super::node::Mark;
use super::rwlock::ZooKeeperRwLock;
use super::session::Session;
use super::{ZooKeeperConfig, ZooKeeperGuard};
use crate::{LockBackend, LockError, LockOptions, validate_name};

/// The smallest TTL (requested session timeout) accepted. A server grants no less than
/// two of its ticks (4 s with the default `tickTime=2000`): a smaller TTL is raised by
/// the server, and the guard reports the granted timeout
/// ([`ZooKeeperGuard::session_timeout`]).
pub const MIN_TTL: Duration = Duration::from_millis(200);

/// The lock recipe of Curator's `InterProcessMutex` and kazoo's `Lock` on a ZooKeeper
/// ensemble, fenced by the lock node's `czxid`.
///
/// Each contender creates an ephemeral sequential node under `<namespace>/<name>/`; the
/// lowest sequence number holds the lock, every other contender watches only the node
/// just before its own (FIFO, no herd). The nodes live in a ZooKeeper session: locks
/// taken with the same TTL share one session (the TTL is the session timeout asked
/// for), kept alive by the client; a lock taken without renewal gets a session of its
/// own, closed when its TTL runs out.
///
/// ```no_run
/// use fencelock::zookeeper::{ZooKeeperConfig, ZooKeeperLocker};
/// use fencelock::{LockBackend, LockGuard, LockOptions};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = ZooKeeperLocker::connect(ZooKeeperConfig::new("127.0.0.1:2181")).await?;
/// let guard = locks.lock("inventory:sku-1", &LockOptions::new()).await?;
/// println!("token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeperLocker {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZooKeeperConfig,
    /// The shared session per TTL, replaced once lost.
    sessions: Mutex<HashMap<Duration, Arc<Session>>>,
}

impl std::fmt::Debug for ZooKeeperLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperLocker")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperLocker {
    /// Checks the configuration and opens a session (with the default TTL, 10 s), so
    /// that an unreachable ensemble shows now rather than at the first lock.
    #[tracing::instrument(fields(backend = "zookeeper"))]
    pub async fn connect(config: ZooKeeperConfig) -> Result<Self, LockError> {
        config.validate()?;
        let locker = Self {
            inner: Arc::new(Inner {
                config,
                sessions: Mutex::new(HashMap::new()),
            }),
        };
        locker.session_for(&LockOptions::new()).await?;
        Ok(locker)
    }

    /// A read-write lock under `name` (see [`ZooKeeperRwLock`]).
    pub fn rwlock(&self, name: &str) -> Result<ZooKeeperRwLock, LockError> {
        ZooKeeperRwLock::new(self.clone(), name)
    }

    /// The configuration.
    pub fn config(&self) -> &ZooKeeperConfig {
        &self.inner.config
    }

    /// The session timeout the server grants to locks taken with `options`: the TTL
    /// asked for, raised or lowered into the server's `minSessionTimeout` ..
    /// `maxSessionTimeout` (4 s and 40 s with the default `tickTime=2000`). It is the
    /// lock's real lease; [`ZooKeeperGuard::session_timeout`] says the same once held.
    /// Opens the session locks with this TTL share (if not open yet), so that it is
    /// known before the first lock; a lock without renewal gets a session of its own
    /// when taken, and this one is closed again.
    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper", ttl = ?options.ttl()))]
    pub async fn session_timeout(&self, options: &LockOptions) -> Result<Duration, LockError> {
        options.validate(MIN_TTL)?;
        Ok(self.session_for(options).await?.timeout)
    }

    /// The session for a lock with `options`: the shared one for its TTL, or a new one
    /// of its own for a lock without renewal.
    pub(crate) async fn session_for(
        &self,
        options: &LockOptions,
    ) -> Result<Arc<Session>, LockError> {
        let config = &self.inner.config;
        if !options.renews() {
            return Session::open(config, options.ttl(), false).await;
        }
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(session) = sessions.get(&options.ttl()) {
            if session.accepts_new() {
                return Ok(session.clone());
            }
        }
        let session = Session::open(config, options.ttl(), true).await?;
        sessions.insert(options.ttl(), session.clone());
        Ok(session)
    }

    pub(crate) async fn acquire(
        &self,
        name: &str,
        options: &LockOptions,
        mark: Mark,
        wait: bool,
    ) -> Result<Option<ZooKeeperGuard>, LockError> {
        validate_name(name)?;
        self.attempt(name, options, wait, |session, holder| async move {
            let namespace = &self.inner.config.namespace;
            acquire(session, namespace, name, mark, wait, &holder).await
        })
        .await
    }

    /// Takes every lock of `names` together, waiting until all are free for it: one
    /// transaction puts a node in every lock's queue, so that no two such acquisitions
    /// (nor any mix with single locks) can deadlock, whatever the order or overlap of
    /// their names; see [`ZooKeeperMultiGuard`] and docs/zookeeper.md. Names are taken
    /// once each, in any order given; at most [`MAX_LOCK_ALL`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockBackend::lock`]: a dropped or timed-out call leaves no node.
    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper"))]
    pub async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<ZooKeeperMultiGuard, LockError> {
        self.acquire_all(names, options, true)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: crate::Backend::ZooKeeper,
                operation: "acquire",
                lock: Some(names.join(",")),
                source: "a waiting acquisition returned without the locks".into(),
            })
    }

    /// Takes every lock of `names` together if all are free for it right now; `Ok(None)`
    /// (leaving every queue) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock_all`](Self::lock_all).
    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper"))]
    pub async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<ZooKeeperMultiGuard>, LockError> {
        self.acquire_all(names, options, false).await
    }

    async fn acquire_all(
        &self,
        names: &[&str],
        options: &LockOptions,
        wait: bool,
    ) -> Result<Option<ZooKeeperMultiGuard>, LockError> {
        let names = crate::name::distinct_names(names, MAX_LOCK_ALL)?;
        let label = names.join(",");
        self.attempt(&label, options, wait, |session, holder| async move {
            let namespace = &self.inner.config.namespace;
            acquire_all(session, namespace, &names, wait, &holder).await
        })
        .await
    }

    /// Runs one acquisition (`acquire`, given the session and the holder record) within
    /// the wait timeout of `options` when it waits, counted in the metrics under `label`;
    /// a session it retires is let go when it ends, or is dropped.
    pub(super) async fn attempt<'a, T, F, Fut>(
        &'a self,
        label: &str,
        options: &LockOptions,
        wait: bool,
        acquire: F,
    ) -> Result<Option<T>, LockError>
    where
        F: FnOnce(Arc<Session>, Vec<u8>) -> Fut,
        Fut: Future<Output = Result<Option<T>, LockError>> + 'a,
    {
        options.validate(MIN_TTL)?;
        let started = Instant::now();
        let attempt = async {
            let session = self.session_for(options).await?;
            let _forget = ForgetIfRetired {
                locker: self,
                session: session.clone(),
            };
            let holder = options.holder_record().unwrap_or_default();
            acquire(session, holder).await
        };
        let result = match options.wait_timeout().filter(|_| wait) {
            Some(limit) => match tokio::time::timeout(limit, attempt).await {
                Ok(result) => result,
                Err(_) => Err(LockError::WaitTimeout {
                    name: label.to_owned(),
                    waited: limit,
                }),
            },
            None => attempt.await,
        };
        crate::metrics::acquisition(crate::Backend::ZooKeeper, label, started, &result);
        result
    }
}

/// Lets go of an acquisition's shared session once the acquisition ends (or is dropped)
/// if it is retired or lost, so that it closes with its last lock or removal instead of
/// living on in the map. In the background: the map's lock is held while a new session
/// opens, which must not delay a grant.
struct ForgetIfRetired<'a> {
    locker: &'a ZooKeeperLocker,
    session: Arc<Session>,
}

impl Drop for ForgetIfRetired<'_> {
    fn drop(&mut self) {
        if self.session.accepts_new() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (inner, session) = (self.locker.inner.clone(), self.session.clone());
        runtime.spawn(async move {
            inner
                .sessions
                .lock()
                .await
                .retain(|_, shared| !Arc::ptr_eq(shared, &session));
        });
    }
}

impl LockBackend for ZooKeeperLocker {
    type Guard = ZooKeeperGuard;

    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper"))]
    async fn lock(&self, name: &str, options: &LockOptions) -> Result<ZooKeeperGuard, LockError> {
        self.acquire(name, options, Mark::Lock, true)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: crate::Backend::ZooKeeper,
                operation: "acquire",
                lock: Some(name.to_owned()),
                source: "a waiting acquisition returned without the lock".into(),
            })
    }

    #[tracing::instrument(skip(self, options), fields(backend = "zookeeper"))]
    async fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<ZooKeeperGuard>, LockError> {
        self.acquire(name, options, Mark::Lock, false).await
    }

    /// [`ZooKeeperLocker::lock_all`]: one `multi` for every lock, the token shared (the
    /// ordered way would deadlock against it on the same names).
    async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<crate::MultiGuard<ZooKeeperGuard>, LockError> {
        ZooKeeperLocker::lock_all(self, names, options)
            .await
            .map(ZooKeeperMultiGuard::into_multi)
    }

    /// [`ZooKeeperLocker::try_lock_all`].
    async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<crate::MultiGuard<ZooKeeperGuard>>, LockError> {
        let taken = ZooKeeperLocker::try_lock_all(self, names, options).await?;
        Ok(taken.map(ZooKeeperMultiGuard::into_multi))
    }
}
