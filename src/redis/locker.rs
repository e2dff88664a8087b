//! The single-instance Redis lock and the Redlock lock, behind the common trait.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::acquire::acquire;
use super::core::Core;
use super::lock_all::take_all;
use super::subscriber::Subscriber;
use super::target::One;
use super::{RedisConfig, RedisGuard, RedisSemaphore};
use crate::{Backend, LockBackend, LockError, LockOptions, MultiGuard, validate_name};

/// The smallest TTL the Redis backends accept.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// A lock on one Redis server (or a master whose replicas may take over, which is
/// exactly when it fails: see the guide's comparison, `docs/redis.md`).
///
/// `SET NX PX` with a unique owner value and an `INCR` token, pipelined in one round trip;
/// compare-and-delete release that wakes waiters over pub/sub; one renewal task for all
/// held locks. Waiting is not fair: on a release every waiter retries and one wins.
///
/// ```no_run
/// use fencelock::redis::{RedisConfig, RedisLocker};
/// use fencelock::{LockBackend, LockGuard, LockOptions};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = RedisLocker::connect(RedisConfig::new("redis://127.0.0.1:6379/")).await?;
/// let guard = locks.lock("inventory:sku-1", &LockOptions::new()).await?;
/// println!("token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLocker {
    core: Arc<Core>,
    subscriber: Arc<Subscriber>,
}

impl std::fmt::Debug for RedisLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLocker")
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}

impl RedisLocker {
    /// Connects to one Redis server and loads the lock scripts.
    #[tracing::instrument(fields(backend = "redis"))]
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        if config.urls.len() != 1 {
            return Err(LockError::InvalidConfig {
                backend: Backend::Redis,
                reason: format!(
                    "a Redis lock takes one server URL, got {}: use RedlockLocker for several",
                    config.urls.len()
                ),
            });
        }
        config.validate(Backend::Redis)?;
        let tls = config.loaded_tls(&config.urls[0], Backend::Redis)?;
        let client = config.client(&config.urls[0], tls.as_ref(), Backend::Redis)?;
        let subscriber = Subscriber::new(client, &config);
        let core = Core::connect(config, Backend::Redis).await?;
        Ok(Self {
            core: Arc::new(core),
            subscriber: Arc::new(subscriber),
        })
    }

    /// The connection to the server the locks use now, for commands beside the locks.
    /// One that stops answering is replaced for the locks (docs/redis.md, "When the
    /// loss is noticed"), not in clones already taken: take one per use.
    #[must_use]
    pub fn connection(&self) -> ConnectionManager {
        self.core.nodes[0].connection()
    }

    /// A semaphore with `permits` holders at once under `name` (not fair; see
    /// [`RedisSemaphore`]).
    pub fn semaphore(&self, name: &str, permits: usize) -> Result<RedisSemaphore, LockError> {
        RedisSemaphore::new(self.core.clone(), self.subscriber.clone(), name, permits)
    }

    /// How many locks the renewal task is tracking.
    #[must_use]
    pub fn held_locks(&self) -> usize {
        self.core.renewer.len()
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.core.config.prefix
    }
}

impl LockBackend for RedisLocker {
    type Guard = RedisGuard;

    #[tracing::instrument(skip(self, options), fields(backend = "redis"))]
    async fn lock(&self, name: &str, options: &LockOptions) -> Result<RedisGuard, LockError> {
        lock_on(&self.core, Some(&self.subscriber), name, options).await
    }

    #[tracing::instrument(skip(self, options), fields(backend = "redis"))]
    async fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<RedisGuard>, LockError> {
        try_lock_on(&self.core, name, options).await
    }

    /// Takes every lock of `names` together, **all or none in one script**, waiting until
    /// every one is free at once: an attempt that finds any of them held takes none and
    /// registers for the release of each one held; the wait holds nothing, and retries on
    /// a release message of any of the locks (or after a bounded, jittered sleep). No two
    /// such acquisitions deadlock, nor any mix with single locks or with locks taken one
    /// by one in name order on the same names: a waiter that holds nothing is in no cycle.
    ///
    /// **Not fair**: the locks are granted only to an attempt that finds all of them
    /// free at once, so under steady contention on its names a large set may wait long
    /// (single-name takers of any of them can keep overtaking it). Each lock gets its own
    /// token from its own counter (not one shared token as on etcd and ZooKeeper):
    /// fence each resource with the token of the lock that guards it
    /// ([`MultiGuard::tokens`]). Each lock is an ordinary [`RedisGuard`] (renewed by the
    /// client's renewal task, released by compare-and-delete); losing any one is losing
    /// the guard ([`MultiGuard::lost_which`] names it).
    ///
    /// Names are taken once each, in any order given; 1 to [`MAX_LOCK_ALL`](super::MAX_LOCK_ALL) of them
    /// (`LockError::InvalidOption` otherwise). A wait timeout bounds the whole call. The
    /// locks' keys must be on the one server (no Redis Cluster: see `docs/redis.md`).
    ///
    /// ```no_run
    /// use fencelock::redis::{RedisConfig, RedisLocker};
    /// use fencelock::{LockBackend, LockGuard, LockOptions};
    ///
    /// # async fn run() -> Result<(), fencelock::LockError> {
    /// let locks = RedisLocker::connect(RedisConfig::new("redis://127.0.0.1:6379/")).await?;
    /// let both = locks.lock_all(&["warehouse-b", "warehouse-a"], &LockOptions::new()).await?;
    /// for (name, token) in both.tokens() {
    ///     println!("{name}: fence with {token}");
    /// }
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](LockBackend::lock): a dropped or timed-out call
    /// compare-and-deletes every lock with its owner value in the background (so a grant
    /// that raced with the drop is undone) and leaves every waiters' set.
    #[tracing::instrument(skip(self, options), fields(backend = "redis"))]
    async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<RedisGuard>, LockError> {
        lock_all_on(&self.core, Some(&self.subscriber), names, options).await
    }

    /// Takes every lock of `names` together if every one is free right now (one script,
    /// as [`lock_all`](Self::lock_all)); `Ok(None)` otherwise, with nothing taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock_all`](Self::lock_all).
    #[tracing::instrument(skip(self, options), fields(backend = "redis"))]
    async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<MultiGuard<RedisGuard>>, LockError> {
        take_all(&self.core, None, names, options, false).await
    }
}

/// Redlock: the same lock on N independent Redis masters, granted when a majority agrees
/// within the lock's validity (TTL minus the time the attempt took minus clock drift).
///
/// It relies on the masters' clocks advancing at the same rate: a clock that jumps can let
/// two clients hold the lock at once (the chaos command's S5 shows it). Its token is the
/// largest of the masters' counters, which is not a fencing token you can rely on. Waiters
/// retry after a jittered sleep.
#[derive(Clone)]
pub struct RedlockLocker {
    core: Arc<Core>,
}

impl std::fmt::Debug for RedlockLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockLocker")
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}

impl RedlockLocker {
    /// Connects to every master (all must be reachable now; later a majority suffices)
    /// and loads the lock scripts on each.
    #[tracing::instrument(fields(backend = "redlock"))]
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        let core = Core::connect(config, Backend::Redlock).await?;
        Ok(Self {
            core: Arc::new(core),
        })
    }

    /// How many masters must agree.
    #[must_use]
    pub fn quorum(&self) -> usize {
        self.core.quorum
    }

    /// The connection to each master the locks use now, for commands beside the locks
    /// (replaced for the locks when it stops answering, not in clones already taken:
    /// take them per use).
    #[must_use]
    pub fn connections(&self) -> Vec<ConnectionManager> {
        self.core
            .nodes
            .iter()
            .map(|node| node.connection())
            .collect()
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }
}

impl LockBackend for RedlockLocker {
    type Guard = RedisGuard;

    #[tracing::instrument(skip(self, options), fields(backend = "redlock"))]
    async fn lock(&self, name: &str, options: &LockOptions) -> Result<RedisGuard, LockError> {
        lock_on(&self.core, None, name, options).await
    }

    #[tracing::instrument(skip(self, options), fields(backend = "redlock"))]
    async fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<RedisGuard>, LockError> {
        try_lock_on(&self.core, name, options).await
    }

    /// Takes every lock of `names` together, all or none, as [`RedisLocker`]'s
    /// `lock_all` does, on every master: granted when a majority of masters took every
    /// lock within the validity (each lock's token the largest of those masters');
    /// otherwise every lock is compare-and-deleted on each master that granted (or failed,
    /// or had not answered yet: once it answers, if it granted or its answer never came),
    /// never on one that refused (however late its refusal came), and the attempt is
    /// repeated after a jittered sleep (at least every 100 ms: Redlock waiters poll). The wait holds nothing, so it cannot deadlock. Not fair; 1 to [`MAX_LOCK_ALL`](super::MAX_LOCK_ALL) names.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](LockBackend::lock): a dropped call compare-and-deletes
    /// every lock on every master in the background.
    #[tracing::instrument(skip(self, options), fields(backend = "redlock"))]
    async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<RedisGuard>, LockError> {
        lock_all_on(&self.core, None, names, options).await
    }

    /// Takes every lock of `names` together if a majority of masters finds every one free
    /// right now; `Ok(None)` otherwise. Before it answers `None` it awaits every master's
    /// answer within the per-master timeout (the request timeout, at most a tenth of the
    /// TTL) from the sending, and the compare-and-delete on each that granted (or failed)
    /// within as long again, so that a caller trying again at once does not meet its own
    /// keys. A master that answers later (or whose undo is not confirmed in time) is
    /// undone in the background, if it granted, once it answers: `Ok(None)` can come
    /// before that undo lands, and a retry at once can then be refused on that master by
    /// the caller's own keys (until the undo, or their TTL if the master never answers).
    /// See `docs/redis.md` (Redlock) for the other ways a refused attempt's keys can
    /// outlive it; none lets two callers hold the locks.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock_all`](Self::lock_all).
    #[tracing::instrument(skip(self, options), fields(backend = "redlock"))]
    async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<MultiGuard<RedisGuard>>, LockError> {
        take_all(&self.core, None, names, options, false).await
    }
}

/// `lock_all` for both lockers: [`take_all`], waiting.
async fn lock_all_on(
    core: &Arc<Core>,
    subscriber: Option<&Arc<Subscriber>>,
    names: &[&str],
    options: &LockOptions,
) -> Result<MultiGuard<RedisGuard>, LockError> {
    let taken = take_all(core, subscriber, names, options, true).await?;
    taken.ok_or_else(|| LockError::Backend {
        backend: core.backend,
        operation: "acquire",
        lock: Some(names.join(",")),
        source: "a waiting acquisition returned without the locks".into(),
    })
}

/// `lock` for both lockers; `subscriber` wakes waiters on release messages (single Redis).
async fn lock_on(
    core: &Arc<Core>,
    subscriber: Option<&Arc<Subscriber>>,
    name: &str,
    options: &LockOptions,
) -> Result<RedisGuard, LockError> {
    validate(name, options)?;
    let one = One::new(core, name);
    let guard = acquire(core, subscriber, one, options, true).await?;
    guard.ok_or_else(|| LockError::Backend {
        backend: core.backend,
        operation: "acquire",
        lock: Some(name.to_owned()),
        source: "a waiting acquisition returned without the lock".into(),
    })
}

/// `try_lock` for both lockers.
async fn try_lock_on(
    core: &Arc<Core>,
    name: &str,
    options: &LockOptions,
) -> Result<Option<RedisGuard>, LockError> {
    validate(name, options)?;
    acquire(core, None, One::new(core, name), options, false).await
}

fn validate(name: &str, options: &LockOptions) -> Result<(), LockError> {
    validate_name(name)?;
    options.validate(MIN_TTL)
}
