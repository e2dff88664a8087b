//! Leader election on etcd: campaign, observe, proclaim, resign.
//!
//! Candidates queue exactly like lock waiters (a key per candidate under the election's
//! prefix, FIFO by create revision): the oldest key is the leader, and its create revision
//! is the leader's fencing token. Leadership is a lock guard, so its loss is reported the
//! same way.

use etcd_client::{EventType, GetOptions, PutOptions, SortOrder, SortTarget, TxnOp, WatchOptions};

use super::acquire::Mode;
use super::call::{call_renewing, map_error};
use super::keys::lock_prefix;
use super::kind::{Kind, check_candidate_value};
use super::token_renewal::MAX_RENEWALS;
use super::watch_token::TokenRefusal;
use super::{EtcdGuard, EtcdLocker};
use crate::{Backend, FencingToken, LockError, LockGuard, LockOptions, LossReason, validate_name};

/// An election under one name; see [`EtcdLocker::election`].
///
/// ```no_run
/// use fencelock::etcd::{EtcdConfig, EtcdLocker};
/// use fencelock::LockOptions;
///
/// # async fn run() -> Result<(), fencelock::LockError> {
/// let locks = EtcdLocker::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?;
/// let election = locks.election("scheduler")?;
/// let leadership = election.campaign("host-a:8080", &LockOptions::new()).await?;
/// println!("leading with token {}", leadership.token());
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EtcdElection {
    locker: EtcdLocker,
    name: String,
    prefix: String,
}

/// The leader as observed: its value and its fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The key of the leader's candidacy.
    pub key: String,
    /// What the leader proclaimed (its address, say).
    pub value: Vec<u8>,
    /// The create revision of its key: the leader's fencing token.
    pub token: FencingToken,
}

impl EtcdElection {
    pub(super) fn new(locker: EtcdLocker, name: &str) -> Result<Self, LockError> {
        validate_name(name)?;
        let prefix = lock_prefix(locker.config().namespace(), name);
        Ok(Self {
            locker,
            name: name.to_owned(),
            prefix,
        })
    }

    /// Stands as a candidate with `value` and waits until elected (or the wait timeout).
    /// Values starting with `fencelock:` are reserved ([`LockError::InvalidOption`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped campaign withdraws its candidacy.
    #[tracing::instrument(skip(self, value, options), fields(backend = "etcd", election = %self.name))]
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        let value = value.into();
        check_candidate_value(&value)?;
        let mode = Mode::Wait {
            timeout: options.wait_timeout(),
        };
        let guard = self
            .locker
            .acquire(&self.name, options, mode, Kind::Candidate { value })
            .await?
            .ok_or_else(|| LockError::Backend {
                backend: Backend::Etcd,
                operation: "campaign",
                lock: Some(self.name.clone()),
                source: "a campaign returned without leadership".into(),
            })?;
        Ok(Leadership { guard })
    }

    /// The current leader, if there is one.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let timeout = self.locker.config().request_timeout();
        let response = call_renewing(
            "leader",
            Some(&self.name),
            timeout,
            self.locker.renewal(),
            || {
                let mut kv = super::answers::kv(self.locker.client());
                let oldest = oldest.clone();
                async move { kv.get(self.prefix.as_str(), Some(oldest)).await }
            },
        )
        .await?;
        Ok(response.kvs().first().map(|kv| Leader {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            token: FencingToken::from_revision(kv.create_revision())
                .unwrap_or(FencingToken::new(0)),
        }))
    }

    /// Follows the leader: each call to [`Observer::next`] returns the next leader (or
    /// value) different from the last one returned.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            watch: None,
            last: None,
        }
    }
}

/// A stream of leader changes; see [`EtcdElection::observe`].
pub struct Observer {
    election: EtcdElection,
    watch: Option<etcd_client::WatchStream>,
    last: Option<Option<Leader>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// Opens the watch of the election's keys and waits until it is created (created
    /// first, then read: no change can fall between the two). A refused watch leaves a
    /// stream that will never tell a change, so a refusal is never kept:
    /// - one for the stream's auth token ("revision of auth store is old", "invalid auth
    ///   token") is asked for again after authenticating again, up to [`MAX_RENEWALS`]
    ///   times, then fails as the token's refusal;
    /// - "permission denied" (a real refusal, or an expired token on older etcd) is told
    ///   apart by a read of the leader: refused, that refusal is the answer; allowed,
    ///   the token was stale, and it goes as above.
    async fn open(&self) -> Result<etcd_client::WatchStream, LockError> {
        let name = Some(self.election.name.as_str());
        let locker = &self.election.locker;
        let timeout = locker.config().request_timeout();
        let mut renewals = 0;
        loop {
            let seen = locker.renewal().seen();
            let mut client = super::answers::watch(locker.client());
            let options = WatchOptions::new().with_prefix();
            let mut stream = client
                .watch(self.election.prefix.as_str(), Some(options))
                .await
                .map_err(|err| map_error("observe", name, err))?;
            let created = stream
                .message()
                .await
                .map_err(|err| map_error("observe", name, err))?;
            let Some(created) = created else {
                return Err(LockError::Unavailable {
                    backend: Backend::Etcd,
                    operation: "observe",
                    lock: name.map(str::to_owned),
                    source: "the watch stream ended before the watch was created".into(),
                });
            };
            if !created.canceled() {
                return Ok(stream);
            }
            let reason = created.cancel_reason();
            let refusal = LockError::Backend {
                backend: Backend::Etcd,
                operation: "observe",
                lock: name.map(str::to_owned),
                source: format!("the election's watch was refused: {reason}").into(),
            };
            match TokenRefusal::of(reason) {
                Some(kind) if renewals < MAX_RENEWALS => {
                    if kind == TokenRefusal::Maybe {
                        // Denied here too: a real refusal, told as one.
                        self.election.leader().await?;
                    }
                    renewals += 1;
                    locker
                        .renewal()
                        .resend_after(refusal, seen, timeout)
                        .await?;
                }
                Some(TokenRefusal::Maybe) => {
                    // Still refused after every renewal: a read says if permission is gone.
                    self.election.leader().await?;
                    return Err(refusal);
                }
                _ => return Err(refusal),
            }
        }
    }

    /// Waits for the leader (`None`: no leader) to differ from the last one returned; the
    /// first call returns the current state at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call loses no change; the next call compares with the last
    /// state it returned.
    pub async fn next(&mut self) -> Result<Option<Leader>, LockError> {
        loop {
            if self.watch.is_none() {
                self.watch = Some(self.open().await?);
            }
            let now = self.election.leader().await?;
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                return Ok(now);
            }
            let Some(stream) = self.watch.as_mut() else {
                continue;
            };
            match stream.message().await {
                Ok(Some(response)) if !response.canceled() => {
                    let relevant = response
                        .events()
                        .iter()
                        .any(|e| matches!(e.event_type(), EventType::Put | EventType::Delete));
                    if !relevant {
                        continue;
                    }
                }
                // Stream ended or broke: watch again (and re-read).
                _ => self.watch = None,
            }
        }
    }
}

/// Being the leader. Dropping it resigns in the background.
#[derive(Debug)]
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    guard: EtcdGuard,
}

impl Leadership {
    /// The leader's fencing token: the create revision of its candidacy key.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// `false` once leadership is known lost or its lease's time has run out.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership may be gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// Announces a new value, only while still the leader ([`LockError::NotHeld`]
    /// otherwise: nothing is written). Values starting with `fencelock:` are reserved.
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<(), LockError> {
        let value = value.into();
        check_candidate_value(&value)?;
        let put = PutOptions::new().with_lease(self.guard.lease_id());
        let op = TxnOp::put(self.guard.key(), value, Some(put));
        self.guard.txn_if_held(vec![op]).await.map(drop)
    }

    /// Steps down: deletes the candidacy key (only if it is still ours).
    pub async fn resign(self) -> Result<crate::ReleaseOutcome, LockError> {
        self.guard.release().await
    }

    /// The guard behind the leadership, for owner-guarded writes.
    pub fn guard(&self) -> &EtcdGuard {
        &self.guard
    }
}
