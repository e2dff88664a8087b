//! A counting semaphore on one Redis server: N permit slots, each a `SET NX PX` lock.

use std::sync::Arc;

use super::RedisGuard;
use super::acquire::acquire;
use super::core::Core;
use super::keys::LockKeys;
use super::locker::MIN_TTL;
use super::subscriber::Subscriber;
use super::target::One;
use crate::options::validate_permits;
use crate::{Backend, LockError, LockOptions, validate_name};

/// `permits` holders at once; see [`RedisLocker::semaphore`](super::RedisLocker::semaphore).
///
/// One acquire script takes the first free of N slot keys (`SET NX PX`) and draws a token
/// from the semaphore's counter; release frees the slot and wakes waiters over pub/sub,
/// and the renewal task keeps held slots alive like locks. What it does not guarantee,
/// beyond what the Redis lock does not (failover can lose permits and repeat tokens):
/// waiters are **not** admitted in arrival order — whoever retries first after a release
/// wins — and every client must use the same number of permits.
#[derive(Clone)]
pub struct RedisSemaphore {
    core: Arc<Core>,
    subscriber: Arc<Subscriber>,
    name: String,
    permits: usize,
}

impl std::fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

impl RedisSemaphore {
    pub(super) fn new(
        core: Arc<Core>,
        subscriber: Arc<Subscriber>,
        name: &str,
        permits: usize,
    ) -> Result<Self, LockError> {
        validate_name(name)?;
        validate_permits(permits)?;
        Ok(Self {
            core,
            subscriber,
            name: name.to_owned(),
            permits,
        })
    }

    fn permit(&self) -> One {
        One {
            name: Arc::from(self.name.as_str()),
            keys: LockKeys::permits(&self.core.config.prefix, &self.name, self.permits),
        }
    }

    /// Takes a permit, waiting (on release messages, or a bounded sleep) until one is free.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an abandoned attempt's slot, if it got one, is freed in the background.
    #[tracing::instrument(skip(self, options), fields(backend = "redis", semaphore = %self.name, permits = self.permits))]
    pub async fn acquire(&self, options: &LockOptions) -> Result<RedisGuard, LockError> {
        options.validate(MIN_TTL)?;
        acquire(
            &self.core,
            Some(&self.subscriber),
            self.permit(),
            options,
            true,
        )
        .await?
        .ok_or_else(|| LockError::Backend {
            backend: Backend::Redis,
            operation: "acquire",
            lock: Some(self.name.clone()),
            source: "a waiting acquisition returned without a permit".into(),
        })
    }

    /// Takes a permit if one is free now.
    #[tracing::instrument(skip(self, options), fields(backend = "redis", semaphore = %self.name, permits = self.permits))]
    pub async fn try_acquire(
        &self,
        options: &LockOptions,
    ) -> Result<Option<RedisGuard>, LockError> {
        options.validate(MIN_TTL)?;
        acquire(&self.core, None, self.permit(), options, false).await
    }
}
