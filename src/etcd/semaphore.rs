//! A counting semaphore on etcd: N holders at once, FIFO, each permit fenced by its key's
//! create revision.

use super::acquire::Mode;
use super::kind::Kind;
use super::{EtcdGuard, EtcdLocker};
use crate::options::validate_permits;
use crate::{LockError, LockOptions, validate_name};

/// `permits` holders at once under one name; see `EtcdLocker::semaphore`.
///
/// Waiters are admitted in the order they arrived (create revision), and only the waiters
/// concerned are woken (see the module `permits`). Each permit is an [`EtcdGuard`]: its
/// token, loss reporting, guarded release, cancel safety and session are those of the
/// mutex. Every client should use the same number of permits for the same name: permits
/// of semaphores with different N (or a lock, or a read-write lock, under the same name)
/// never share, so holders are never more than any of them allows, but they serialise.
///
/// ```no_run
/// use fencelock::etcd::{EtcdConfig, EtcdLocker};
/// use fencelock::{LockGuard, LockOptions};
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// let calls = locks.semaphore("payment-provider", 4)?; // at most 4 calls at once
/// let permit = calls.acquire(&LockOptions::new()).await?;
/// println!("calling with token {}", permit.token());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EtcdSemaphore {
    locker: EtcdLocker,
    name: String,
    permits: usize,
}

impl EtcdSemaphore {
    pub(super) fn new(locker: EtcdLocker, name: &str, permits: usize) -> Result<Self, LockError> {
        validate_name(name)?;
        validate_permits(permits)?;
        Ok(Self {
            locker,
            name: name.to_owned(),
            permits,
        })
    }

    fn kind(&self) -> Kind {
        Kind::Permit {
            permits: self.permits,
        }
    }

    /// How many holders at once.
    #[must_use]
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// Takes a permit, waiting in line until one is free (or the wait timeout).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped or timed-out wait leaves no key behind.
    #[tracing::instrument(skip(self, options), fields(backend = "etcd", semaphore = %self.name, permits = self.permits))]
    pub async fn acquire(&self, options: &LockOptions) -> Result<EtcdGuard, LockError> {
        let mode = Mode::Wait {
            timeout: options.wait_timeout(),
        };
        let guard = self
            .locker
            .acquire(&self.name, options, mode, self.kind())
            .await?;
        guard.ok_or_else(|| LockError::Backend {
            backend: crate::Backend::Etcd,
            operation: "acquire",
            lock: Some(self.name.clone()),
            source: "a waiting acquisition returned without a permit".into(),
        })
    }

    /// Takes a permit if one is free now (and nobody waits ahead).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    #[tracing::instrument(skip(self, options), fields(backend = "etcd", semaphore = %self.name, permits = self.permits))]
    pub async fn try_acquire(&self, options: &LockOptions) -> Result<Option<EtcdGuard>, LockError> {
        self.locker
            .acquire(&self.name, options, Mode::Try, self.kind())
            .await
    }
}
