//! Lock options: lease TTL, wait timeout, renewal.

use std::time::Duration;

use crate::LockError;

/// The longest TTL accepted: a lock that outlives a dead holder by more than a day is a
/// configuration mistake, not a choice.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How a lock is taken and kept.
///
/// ```
/// use std::time::Duration;
/// use fencelock::LockOptions;
///
/// let options = LockOptions::new()
///     .with_ttl(Duration::from_secs(5))
///     .with_wait_timeout(Duration::from_secs(30));
/// assert_eq!(options.ttl(), Duration::from_secs(5));
/// assert_eq!(options.wait_timeout(), Some(Duration::from_secs(30)));
/// assert!(options.renews());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct LockOptions {
    ttl: Duration,
    wait_timeout: Option<Duration>,
    renew: bool,
    holder_info: bool,
    holder_label: Option<String>,
    holder_program: Option<String>,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            wait_timeout: None,
            renew: true,
            holder_info: true,
            holder_label: None,
            holder_program: None,
        }
    }
}

impl LockOptions {
    /// Ten-second lease, renewed automatically, waiting as long as it takes.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock outlives a holder that stops renewing it (crashed, paused, cut off).
    ///
    /// Backends round this to their own granularity: etcd leases are whole seconds, and an
    /// etcd server may raise a lease to its own minimum (1.5 x its election timeout).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Gives up waiting after `timeout`, with [`LockError::WaitTimeout`]; nothing is left
    /// behind in the queue. The timeout bounds the whole call, connecting and joining
    /// included (plus at most 250 ms to leave the queue cleanly).
    pub fn with_wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// Waits as long as it takes (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait_timeout = None;
        self
    }

    /// Whether the lease is renewed in the background while the lock is held (the default),
    /// or the lock simply expires `ttl` after it was granted.
    pub fn with_renewal(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// A label recorded with the holder (a job id, a URL: at most 256 bytes), for
    /// operators (`fencelock locks`, the backends' `inspect`). See
    /// [`HolderInfo`](crate::HolderInfo).
    pub fn with_holder_label(mut self, label: impl Into<String>) -> Self {
        self.holder_label = Some(label.into());
        self
    }

    /// Whether the acquisition records who holds (the default): host name, pid, program,
    /// the time asked (by this machine's clock), the TTL and the label, where the backend
    /// keeps them (the ZooKeeper node's data, the etcd key's value, the Redis and Redlock
    /// key's value after the owner value). `false` records nothing, for services whose
    /// host or program names must not reach the lock service.
    pub fn with_holder_info(mut self, record: bool) -> Self {
        self.holder_info = record;
        self
    }

    /// The program recorded with the holder, instead of the file name this process was
    /// started as (`fencelock run` records the command it runs).
    pub fn with_holder_program(mut self, program: impl Into<String>) -> Self {
        self.holder_program = Some(program.into());
        self
    }

    /// The holder's label, if one was given.
    #[must_use]
    pub fn holder_label(&self) -> Option<&str> {
        self.holder_label.as_deref()
    }

    /// The holder record an acquisition with these options leaves, made now; `None`
    /// when [`with_holder_info`](Self::with_holder_info) is off. (PostgreSQL advisory
    /// locks keep no record: the server shows their sessions itself.)
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", feature = "redis")),
        allow(dead_code)
    )]
    pub(crate) fn holder_record(&self) -> Option<Vec<u8>> {
        self.holder_info.then(|| {
            crate::HolderInfo::encode_this_process(
                self.ttl,
                self.holder_label.as_deref(),
                self.holder_program.as_deref(),
            )
        })
    }

    /// The lease TTL.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait timeout; `None` waits forever.
    #[must_use]
    pub fn wait_timeout(&self) -> Option<Duration> {
        self.wait_timeout
    }

    /// Whether the lease is renewed automatically.
    #[must_use]
    pub fn renews(&self) -> bool {
        self.renew
    }

    /// Checks the options against `min_ttl`, the smallest TTL the backend can honour.
    pub fn validate(&self, min_ttl: Duration) -> Result<(), LockError> {
        if self.ttl.is_zero() {
            return Err(invalid(
                "ttl",
                "zero: a lock needs a lease to expire by".into(),
            ));
        }
        if self.ttl < min_ttl {
            return Err(invalid(
                "ttl",
                format!(
                    "{:?} is below this backend's minimum of {min_ttl:?}",
                    self.ttl
                ),
            ));
        }
        if self.ttl > MAX_TTL {
            return Err(invalid(
                "ttl",
                format!("{:?} is above the maximum of 24h", self.ttl),
            ));
        }
        if let Some(label) = &self.holder_label
            && label.len() > crate::holder::MAX_LABEL_LEN
        {
            return Err(invalid(
                "holder_label",
                format!(
                    "{} bytes: at most {} are recorded",
                    label.len(),
                    crate::holder::MAX_LABEL_LEN
                ),
            ));
        }
        if self.wait_timeout == Some(Duration::ZERO) {
            return Err(invalid(
                "wait_timeout",
                "zero: use try_lock to return at once".into(),
            ));
        }
        Ok(())
    }
}

/// A semaphore needs at least one permit (both backends' semaphores check this).
#[cfg(any(feature = "etcd", feature = "redis"))]
pub(crate) fn validate_permits(permits: usize) -> Result<(), LockError> {
    if permits == 0 {
        return Err(invalid(
            "permits",
            "zero: a semaphore needs at least one permit".into(),
        ));
    }
    Ok(())
}

fn invalid(option: &'static str, reason: String) -> LockError {
    LockError::InvalidOption { option, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn defaults_are_valid() {
        assert!(LockOptions::new().validate(SECOND).is_ok());
    }

    #[test]
    fn refuses_zero_tiny_and_huge_ttls() {
        for ttl in [Duration::ZERO, Duration::from_millis(999), MAX_TTL + SECOND] {
            let err = LockOptions::new()
                .with_ttl(ttl)
                .validate(SECOND)
                .expect_err("must be refused");
            assert!(
                matches!(err, LockError::InvalidOption { option: "ttl", .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn refuses_a_zero_wait_timeout() {
        let err = LockOptions::new()
            .with_wait_timeout(Duration::ZERO)
            .validate(SECOND)
            .expect_err("must be refused");
        assert!(err.is_invalid_input());
    }
}
