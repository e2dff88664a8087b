//! The etcd lock backend: a client, its sessions, and the [`LockBackend`] implementation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions, KvClient};

use super::acquire::{CLEANUP_ALLOWANCE, Mode, acquire};
use super::call::{call_renewing, call_retrying, map_error};
use super::kind::Kind;
use super::lock_all::{MAX_LOCK_ALL, acquire_all};
use super::token_renewal::TokenRenewal;
use super::watch_hub::WatchHub;
use super::{EtcdConfig, EtcdElection, EtcdGuard, EtcdRwLock, EtcdSemaphore, Session};
use crate::{Backend, LockBackend, LockError, LockOptions, MultiGuard, validate_name};

/// The smallest TTL the etcd backend accepts: leases are whole seconds.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// Locks in etcd, fenced by create revision.
///
/// Locks taken with the same TTL share one [`Session`] (one lease, one keep-alive task);
/// locks without renewal get a lease of their own that simply runs out. Cloning is cheap
/// and shares the connection and the sessions.
///
/// ```no_run
/// use fencelock::etcd::{EtcdConfig, EtcdLocker};
/// use fencelock::{LockBackend, LockGuard, LockOptions};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// let guard = locks.lock("inventory:sku-1", &LockOptions::new()).await?;
/// println!("token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EtcdLocker {
    inner: Arc<LockerInner>,
}

struct LockerInner {
    client: Client,
    /// What the sessions' key-value requests (joins, releases) go out on: fencelock's
    /// own transport where the configuration allows it (`grpc_transport`), else
    /// `client`'s channel.
    kv: KvClient,
    /// Authenticates again for requests refused with an old token (`token_renewal.rs`).
    renewal: TokenRenewal,
    config: Arc<EtcdConfig>,
    /// One watch stream for the client, one watch per lock name on it (`watch_hub.rs`).
    hub: Arc<WatchHub>,
    // Renewed sessions by TTL in whole seconds.
    sessions: Mutex<HashMap<u64, Session>>,
    // Retired sessions that may still carry guards: `close` closes them too.
    retired: Mutex<Vec<std::sync::Weak<super::session::SessionInner>>>,
    // Serialises session creation so concurrent first locks share one lease.
    opening: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for LockerInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLocker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdLocker {
    /// Connects and proves the connection (and the credentials, and read access to the
    /// namespace) with one read, all within the connect timeout.
    #[tracing::instrument(fields(backend = "etcd"))]
    pub async fn connect(config: EtcdConfig) -> Result<Self, LockError> {
        config.validate()?;
        let tls = config.loaded_tls()?;
        let options = config.connect_options(tls.as_ref());
        let timeout = config.connect_timeout;
        // Boxed: the connect future is large (a probe, a diagnosis racing it), and a
        // caller's stack need not carry it.
        let connecting = Box::pin(async {
            let client = Client::connect(&config.endpoints, Some(options))
                .await
                .map_err(|err| map_error("connect", None, err))?;
            let renewal = TokenRenewal::new(client.clone());
            // One point read of the namespace's own key: it proves the connection, the
            // credentials and read access to the namespace, and costs the same however
            // many (live or deleted) keys the namespace holds, unlike a range over it.
            let probe = GetOptions::new().with_keys_only();
            let prefix = format!("{}/", config.namespace);
            let read = || {
                let mut client = client.clone();
                let (prefix, probe) = (prefix.clone(), probe.clone());
                async move { client.get(prefix, Some(probe)).await }
            };
            let endpoints = tls_endpoints(&config);
            let first =
                crate::tls::first_contact(
                    Backend::Etcd,
                    timeout,
                    call_renewing("connect", None, timeout, &renewal, read),
                    |limit| {
                        let (endpoints, tls) = (&endpoints, tls.as_ref());
                        async move {
                            crate::tls::explain(endpoints, tls, b"h2", Backend::Etcd, limit).await
                        }
                    },
                )
                .await;
            match first {
                Ok(_) => return Ok((client, renewal)),
                Err(err) if err.is_unavailable() => {
                    tracing::debug!(%err, "first connect probe failed; trying the others");
                }
                Err(err) => return Err(err),
            }
            // One member down must not fail the connect: retry on another.
            call_retrying("connect", None, timeout, &renewal, read).await?;
            Ok::<_, LockError>((client, renewal))
        });
        // The sessions' transport is proven within the same connect timeout.
        let connecting = async {
            let (client, renewal) = connecting.await?;
            let kv = kv_client(&config, &client, &renewal).await?;
            Ok::<_, LockError>((client, renewal, kv))
        };
        let (client, renewal, kv) = match tokio::time::timeout(timeout, connecting).await {
            Ok(client) => client?,
            Err(_) => {
                return Err(LockError::Timeout {
                    backend: Backend::Etcd,
                    operation: "connect",
                    lock: None,
                    after: timeout,
                });
            }
        };
        Ok(Self {
            inner: Arc::new(LockerInner {
                hub: Arc::new(WatchHub::start(client.clone(), renewal.clone())),
                client,
                kv,
                renewal,
                config: Arc::new(config),
                sessions: Mutex::new(HashMap::new()),
                retired: Mutex::new(Vec::new()),
                opening: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Stops the client's watch task as a panic in it would: a fault for tests, which
    /// then check what waiters and holders are told.
    #[cfg(feature = "testkit")]
    #[doc(hidden)]
    pub fn stop_watch_task_for_test(&self) {
        self.inner.hub.stop_task();
    }

    /// How many turns the client's watch task has taken so far (passes of its loop, one
    /// per wake-up or piece of work found ready), for tests of what wakes it.
    #[cfg(feature = "testkit")]
    #[doc(hidden)]
    #[must_use]
    pub fn watch_task_turns_for_test(&self) -> u64 {
        self.inner.hub.turns()
    }

    /// The underlying etcd client, for reads and writes beside the locks.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The client's token renewal (`token_renewal.rs`), for requests made beside the
    /// sessions'.
    pub(crate) fn renewal(&self) -> &TokenRenewal {
        &self.inner.renewal
    }

    /// The configuration this locker was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The renewed session used for locks of this `ttl`, opened if there is none yet (or
    /// the previous one was lost).
    pub async fn session(&self, ttl: Duration) -> Result<Session, LockError> {
        let seconds = whole_seconds(ttl);
        if let Some(session) = self.live_session(seconds) {
            return Ok(session);
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(session) = self.live_session(seconds) {
            return Ok(session);
        }
        // A retired session is forgotten at once: then only its guards keep it (and its
        // lease) alive, and the next lock of this TTL opens a new one.
        let locker = Arc::downgrade(&self.inner);
        let forget: super::session::RetireHook = Arc::new(move |lease_id| {
            if let Some(inner) = locker.upgrade() {
                let mut sessions = inner
                    .sessions
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if sessions
                    .get(&seconds)
                    .is_some_and(|s| s.lease_id() == lease_id)
                {
                    if let Some(retired) = sessions.remove(&seconds) {
                        let mut kept = inner
                            .retired
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        kept.retain(|s| s.strong_count() > 0);
                        kept.push(Arc::downgrade(&retired.inner));
                    }
                }
            }
        });
        let session = Session::open(
            self.inner.client.clone(),
            self.inner.kv.clone(),
            self.inner.renewal.clone(),
            self.inner.config.clone(),
            Duration::from_secs(seconds),
            self.inner.hub.clone(),
            Some(forget),
        )
        .await?;
        self.sessions().insert(seconds, session.clone());
        Ok(session)
    }

    /// A semaphore with `permits` holders at once under `name`. Every client of the
    /// semaphore must use the same number of permits.
    pub fn semaphore(&self, name: &str, permits: usize) -> Result<EtcdSemaphore, LockError> {
        EtcdSemaphore::new(self.clone(), name, permits)
    }

    /// A leader election under `name`: candidates queue like lock waiters, the oldest is
    /// the leader, and its token is its key's create revision.
    pub fn election(&self, name: &str) -> Result<EtcdElection, LockError> {
        EtcdElection::new(self.clone(), name)
    }

    /// A read-write lock under `name`: readers share it, writers exclude everyone, in
    /// arrival order (a waiting writer holds back the readers behind it).
    pub fn rwlock(&self, name: &str) -> Result<EtcdRwLock, LockError> {
        EtcdRwLock::new(self.clone(), name)
    }

    /// Closes every session, retired ones included: their leases are revoked, which frees
    /// every lock they hold, and their guards report
    /// [`LossReason::Closed`](crate::LossReason::Closed).
    pub async fn close(&self) -> Result<(), LockError> {
        let mut sessions: Vec<Session> = self.sessions().drain().map(|(_, s)| s).collect();
        let retired = std::mem::take(
            &mut *self
                .inner
                .retired
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        sessions.extend(
            retired
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .map(|inner| Session { inner }),
        );
        let mut result = Ok(());
        for session in sessions {
            if let Err(err) = session.close().await {
                result = Err(err);
            }
        }
        result
    }

    fn live_session(&self, seconds: u64) -> Option<Session> {
        self.sessions()
            .get(&seconds)
            .filter(|s| s.inner.is_usable())
            .cloned()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Session>> {
        // The map stays consistent even if a holder panicked: recover it.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a lock of `kind` under `name`. A wait timeout bounds the whole call: opening
    /// the session, joining the queue and waiting (plus at most [`CLEANUP_ALLOWANCE`] to
    /// leave the queue cleanly).
    pub(super) async fn acquire(
        &self,
        name: &str,
        options: &LockOptions,
        mode: Mode,
        kind: Kind,
    ) -> Result<Option<EtcdGuard>, LockError> {
        let counted = std::time::Instant::now();
        let result = self.acquire_uncounted(name, options, mode, kind).await;
        crate::metrics::acquisition(Backend::Etcd, name, counted, &result);
        result
    }

    async fn acquire_uncounted(
        &self,
        name: &str,
        options: &LockOptions,
        mode: Mode,
        kind: Kind,
    ) -> Result<Option<EtcdGuard>, LockError> {
        validate_name(name)?;
        options.validate(MIN_TTL)?;
        let started = tokio::time::Instant::now();
        // Who holds, after the kind's marker (`kind.rs`): read by `inspect` and `locks`.
        let value = kind.value_with(options.holder_record());
        self.on_session(name, options, mode, |session, owns| {
            acquire(session, owns, name, mode, kind, value, started)
        })
        .await
    }

    /// Runs `acquire` (given the session and whether it owns it) on the session `options`
    /// ask for: the renewed one of its TTL, or one of its own for a lock without renewal.
    /// A wait timeout bounds the whole call, opening the session included (plus at most
    /// [`CLEANUP_ALLOWANCE`] to leave the queue cleanly); `label` names the lock(s) in
    /// that timeout's error.
    async fn on_session<T, F, Fut>(
        &self,
        label: &str,
        options: &LockOptions,
        mode: Mode,
        acquire: F,
    ) -> Result<Option<T>, LockError>
    where
        F: FnOnce(Session, bool) -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, LockError>>,
    {
        // Opening a session is boxed: it happens once per TTL (or once per lock without
        // renewal, beside a lease grant's round trip), and its future (about 19 KiB, a
        // lease grant and the keep-alive's start) would otherwise sit in every lock's
        // future, copied from frame to frame on every acquisition.
        let work = async {
            if options.renews() {
                let session = match self.live_session(whole_seconds(options.ttl())) {
                    Some(session) => session,
                    None => Box::pin(self.session(options.ttl())).await?,
                };
                acquire(session, false).await
            } else {
                let session = Box::pin(Session::open(
                    self.inner.client.clone(),
                    self.inner.kv.clone(),
                    self.inner.renewal.clone(),
                    self.inner.config.clone(),
                    options.ttl(),
                    self.inner.hub.clone(),
                    None,
                ))
                .await?;
                acquire(session, true).await
            }
        };
        match mode {
            // The acquisition stops waiting at the timeout by itself; this bounds what it
            // cannot interrupt (opening a session, joining) when etcd does not answer.
            Mode::Wait {
                timeout: Some(timeout),
            } => tokio::time::timeout(timeout + CLEANUP_ALLOWANCE, work)
                .await
                .unwrap_or_else(|_| {
                    Err(LockError::WaitTimeout {
                        name: label.to_owned(),
                        waited: timeout,
                    })
                }),
            Mode::Try | Mode::Wait { timeout: None } => work.await,
        }
    }

    /// Takes every lock of `names` together, waiting until all are free for it: **one
    /// transaction** puts a key in every lock's queue, so all of them share one create
    /// revision, which is the [`token`](crate::LockGuard::token) of every name (larger than every
    /// earlier grant's of each name). Each key waits in its own lock's queue (FIFO per
    /// name, on the watches single locks use), and the locks are held once every key is
    /// at the head of its queue. Losing any one lock is losing them all
    /// ([`MultiGuard::lost_which`] names it); releasing deletes every key in one
    /// transaction, one Raft proposal ([`LockGuard::release_all`](crate::LockGuard::release_all)).
    ///
    /// No two such acquisitions deadlock, whatever the order or overlap of their names,
    /// nor any mix with single locks (fencelock's, or `etcdctl lock`) on those names: a
    /// key waits only for keys of lower revision in its queue, and all keys of one
    /// acquisition share one revision, so waiting always points to lower revisions. Do
    /// **not** mix with locks taken one after another on the same names (an older
    /// fencelock's `lock_all`, or nested locks: `lock(a)` held while `lock(b)` waits, even
    /// in name order): that can deadlock (see `docs/etcd.md`). Single locks are safe
    /// beside it only if they wait for nothing while they hold.
    /// [`crate::lock_all`] and `fencelock run --lock a --lock b` use this one on etcd.
    ///
    /// Names are taken once each, in any order given; 1 to [`MAX_LOCK_ALL`] of them
    /// (`LockError::InvalidOption` otherwise). A wait timeout bounds the whole call.
    ///
    /// ```no_run
    /// use fencelock::etcd::{EtcdConfig, EtcdLocker};
    /// use fencelock::{LockGuard, LockOptions};
    ///
    /// # async fn run() -> Result<(), fencelock::LockError> {
    /// let locks = EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
    /// let both = locks.lock_all(&["warehouse-b", "warehouse-a"], &LockOptions::new()).await?;
    /// println!("both held with token {}", both.token());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockBackend::lock`]: a dropped or timed-out call leaves no key
    /// (each is removed, in the background if need be), and a lock granted meanwhile is
    /// released.
    #[tracing::instrument(skip(self, options), fields(backend = "etcd"))]
    pub async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<EtcdGuard>, LockError> {
        let mode = Mode::Wait {
            timeout: options.wait_timeout(),
        };
        self.acquire_all(names, options, mode)
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: Backend::Etcd,
                operation: "acquire",
                lock: Some(names.join(",")),
                source: "a waiting acquisition returned without the locks".into(),
            })
    }

    /// Takes every lock of `names` together if every one is free for it right now (one
    /// transaction, as [`lock_all`](Self::lock_all)); `Ok(None)` otherwise, every key
    /// removed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock_all`](Self::lock_all).
    #[tracing::instrument(skip(self, options), fields(backend = "etcd"))]
    pub async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<MultiGuard<EtcdGuard>>, LockError> {
        self.acquire_all(names, options, Mode::Try).await
    }

    async fn acquire_all(
        &self,
        names: &[&str],
        options: &LockOptions,
        mode: Mode,
    ) -> Result<Option<MultiGuard<EtcdGuard>>, LockError> {
        let names = crate::name::distinct_names(names, MAX_LOCK_ALL)?;
        options.validate(MIN_TTL)?;
        let label = names.join(",");
        let counted = std::time::Instant::now();
        let started = tokio::time::Instant::now();
        let value = Kind::Mutex.value_with(options.holder_record());
        let result = self
            .on_session(&label, options, mode, |session, owns| {
                acquire_all(session, owns, &names, mode, value, started)
            })
            .await;
        crate::metrics::acquisition(Backend::Etcd, &label, counted, &result);
        Ok(result?.map(|guards| MultiGuard::new(guards, label)))
    }
}

impl LockBackend for EtcdLocker {
    type Guard = EtcdGuard;

    #[tracing::instrument(skip(self, options), fields(backend = "etcd"))]
    async fn lock(&self, name: &str, options: &LockOptions) -> Result<EtcdGuard, LockError> {
        let mode = Mode::Wait {
            timeout: options.wait_timeout(),
        };
        let guard = self.acquire(name, options, mode, Kind::Mutex).await?;
        guard.ok_or_else(|| LockError::Backend {
            backend: Backend::Etcd,
            operation: "acquire",
            lock: Some(name.to_owned()),
            source: "a waiting acquisition returned without the lock".into(),
        })
    }

    #[tracing::instrument(skip(self, options), fields(backend = "etcd"))]
    async fn try_lock(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<Option<EtcdGuard>, LockError> {
        self.acquire(name, options, Mode::Try, Kind::Mutex).await
    }

    /// [`EtcdLocker::lock_all`]: one transaction for every lock (the ordered way would
    /// deadlock against it, see there).
    async fn lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<EtcdGuard>, LockError> {
        EtcdLocker::lock_all(self, names, options).await
    }

    /// [`EtcdLocker::try_lock_all`].
    async fn try_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Option<MultiGuard<EtcdGuard>>, LockError> {
        EtcdLocker::try_lock_all(self, names, options).await
    }
}

/// A TTL in whole seconds, rounded up: etcd's leases are whole seconds, and sessions are
/// shared by locks whose TTLs round to the same number.
fn whole_seconds(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// The endpoints of `config`, as [`crate::tls::explain`] takes them.
fn tls_endpoints(config: &EtcdConfig) -> Vec<crate::tls::Endpoint> {
    let tls = config.uses_tls();
    config
        .endpoints
        .iter()
        .map(|endpoint| crate::tls::Endpoint {
            address: endpoint
                .split_once("://")
                .map_or(endpoint.as_str(), |(_, rest)| rest)
                .trim_end_matches('/')
                .to_owned(),
            tls,
            shown: endpoint.clone(),
        })
        .collect()
}

/// The client for the sessions' key-value requests ([`LockerInner::kv`]). Fencelock's own
/// transport is proven with the connect's read (the caller bounds the time), so that a
/// locker that connected has its connection for locks too.
async fn kv_client(
    config: &EtcdConfig,
    client: &Client,
    renewal: &TokenRenewal,
) -> Result<KvClient, LockError> {
    let Some(endpoints) = config.own_transport_endpoints() else {
        return Ok(super::answers::kv(client));
    };
    let timeout = config.connect_timeout;
    let lane = crate::grpc_transport::Lane::new(endpoints, timeout, config.request_timeout);
    let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(lane));
    // The same options as the channel's (require-leader above all); no credentials (the
    // transport is not used with them), so this sends nothing.
    let own = Client::from_channel(channel, Some(config.connect_options(None)))
        .await
        .map_err(|err| map_error("connect", None, err))?;
    let kv = super::answers::kv(&own);
    let probe = GetOptions::new().with_keys_only();
    let prefix = format!("{}/", config.namespace);
    let read = || {
        let mut kv = kv.clone();
        let (prefix, probe) = (prefix.clone(), probe.clone());
        async move { kv.get(prefix, Some(probe)).await }
    };
    // A member that cannot be reached is left for the next (its connect gets a share of
    // the connect timeout, `grpc_transport/lane.rs`), as tonic's balancer would.
    call_retrying("connect", None, timeout, renewal, read).await?;
    Ok(kv)
}
