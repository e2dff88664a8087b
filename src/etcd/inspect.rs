//! A lock seen from outside: who holds it, with which token and lease, and who waits behind
//! them, in queue order. For operators (`fencelock locks`) and for services that expose
//! their locks' state.
//!
//! Everything comes from one consistent read of the lock's keys (at one revision) and the
//! leases' remaining TTLs. etcd keeps no wall-clock time with a key: how long a key has
//! been there is given in writes to the store since it was created (`writes_since`), and,
//! for a lease that is not renewed, in how much of its TTL has passed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{GetOptions, LeaseTimeToLiveOptions, SortOrder, SortTarget};

use super::call::{call_retrying, malformed};
use super::kind::Kind;
use super::locker::EtcdLocker;
use crate::{FencingToken, LockError, validate_name};

/// What a key in a lock's queue stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// A lock (fencelock's mutex, or Go's `concurrency.Mutex`, `etcdctl lock`, the Lock
    /// RPC: their keys hold an empty value too).
    Lock,
    /// A read-write lock's reader.
    Reader,
    /// A read-write lock's writer.
    Writer,
    /// One of `permits` permits of a semaphore.
    Permit {
        /// How many holders the semaphore admits.
        permits: usize,
    },
    /// An election candidate, with the value it proclaims (or any other value fencelock
    /// did not write: such a key excludes everyone, like a candidate).
    Candidate {
        /// The key's value.
        value: Vec<u8>,
    },
}

/// One key of a lock's queue.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QueueEntry {
    /// The etcd key.
    pub key: String,
    /// Its create revision: the fencing token its holder has (or will have).
    pub token: FencingToken,
    /// The lease it lives under (0: none).
    pub lease_id: i64,
    /// What is left of the lease's TTL, as the server counts it; `None` if the key has no
    /// lease or the lease has just expired (the server deletes its keys next).
    pub lease_remaining: Option<Duration>,
    /// The lease's TTL when it was granted or last renewed.
    pub lease_ttl: Option<Duration>,
    /// What the key stands for.
    pub role: Role,
    /// Whether the key holds the lock (admitted with the keys ahead of it), or waits.
    pub holds: bool,
    /// Writes to the store since the key was created: how long it has been there, in
    /// the only clock etcd keeps.
    pub writes_since: i64,
    /// Who made the acquisition, as it recorded itself in the key's value (`None` for
    /// Go's keys, a candidate's, or one made with `with_holder_info(false)`).
    pub holder: Option<crate::HolderInfo>,
}

/// A lock's holders and waiters, in queue order (by create revision).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LockState {
    /// The lock's name.
    pub name: String,
    /// The store's revision when this was read.
    pub revision: i64,
    /// Every key, holders first (a holder is never behind a waiter).
    pub entries: Vec<QueueEntry>,
}

impl LockState {
    /// The keys that hold the lock (one for a lock, up to N for a semaphore, any number
    /// of readers).
    pub fn holders(&self) -> impl Iterator<Item = &QueueEntry> {
        self.entries.iter().filter(|e| e.holds)
    }

    /// The keys that wait, first in line first.
    pub fn waiters(&self) -> impl Iterator<Item = &QueueEntry> {
        self.entries.iter().filter(|e| !e.holds)
    }
}

impl Role {
    fn of(value: &[u8]) -> Self {
        match Kind::from_value(value) {
            Kind::Mutex => Self::Lock,
            Kind::Reader => Self::Reader,
            Kind::Writer => Self::Writer,
            Kind::Permit { permits } => Self::Permit { permits },
            Kind::Candidate { value } => Self::Candidate { value },
        }
    }
}

impl EtcdLocker {
    /// The holders and waiters of lock `name` in this locker's namespace: one read of its
    /// keys, then one lease lookup per distinct lease. A lock nobody holds has no entries.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn inspect(&self, name: &str) -> Result<LockState, LockError> {
        validate_name(name)?;
        let prefix = super::keys::lock_prefix(&self.config().namespace, name);
        let mut all = self.read_locks(&prefix, Some(name)).await?;
        Ok(all.pop().unwrap_or_else(|| LockState {
            name: name.to_owned(),
            revision: 0,
            entries: Vec::new(),
        }))
    }

    /// Every lock of this locker's namespace that has a key (held or waited for), by name.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn inspect_all(&self) -> Result<Vec<LockState>, LockError> {
        let prefix = format!("{}/", self.config().namespace);
        self.read_locks(&prefix, None).await
    }

    /// The store's current revision: every later grant's token (its key's create
    /// revision) is larger. A token storage has seen above it means etcd's history is
    /// behind that token: the data was restored from an older snapshot, or the cluster
    /// was rebuilt empty, and until the revision passes the token every grant carries
    /// one storage has seen (`fencelock locks --newest-token` checks it; docs/etcd.md).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn current_revision(&self) -> Result<u64, LockError> {
        let timeout = self.config().request_timeout;
        let client = self.client();
        let key = format!("{}/", self.config().namespace);
        let response = call_retrying("revision", None, timeout, self.renewal(), || {
            let mut kv = super::answers::kv(client);
            let key = key.clone();
            async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
        })
        .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        u64::try_from(revision).map_err(|_| malformed("revision", None, "a negative revision"))
    }

    async fn read_locks(
        &self,
        prefix: &str,
        lock: Option<&str>,
    ) -> Result<Vec<LockState>, LockError> {
        let timeout = self.config().request_timeout;
        let client = self.client();
        let response = call_retrying("inspect", lock, timeout, self.renewal(), || {
            let mut kv = super::answers::kv(client);
            let prefix = prefix.to_owned();
            async move {
                kv.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await
            }
        })
        .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let namespace_prefix = format!("{}/", self.config().namespace);
        // Keys by lock name, each list in create-revision order (the read's sort order).
        let mut locks: BTreeMap<String, Vec<&etcd_client::KeyValue>> = BTreeMap::new();
        for kv in response.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let Some((name, _)) = key
                .strip_prefix(&namespace_prefix)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            locks.entry(name.to_owned()).or_default().push(kv);
        }
        let mut leases: HashMap<i64, (Option<Duration>, Option<Duration>)> = HashMap::new();
        for kv in response.kvs() {
            let id = kv.lease();
            if id == 0 || leases.contains_key(&id) {
                continue;
            }
            leases.insert(id, self.lease_ttls(id, lock).await?);
        }
        let mut states = Vec::with_capacity(locks.len());
        for (name, kvs) in locks {
            let mut entries: Vec<QueueEntry> = Vec::with_capacity(kvs.len());
            for (i, kv) in kvs.iter().enumerate() {
                let kind = Kind::from_value(kv.value());
                let holds = kind.admitted(kvs[..i].iter().map(|ahead| ahead.value()));
                let token = FencingToken::from_revision(kv.create_revision())
                    .ok_or_else(|| malformed("inspect", lock, "a key without a create revision"))?;
                let (lease_remaining, lease_ttl) =
                    leases.get(&kv.lease()).copied().unwrap_or((None, None));
                entries.push(QueueEntry {
                    key: kv.key_str().unwrap_or_default().to_owned(),
                    token,
                    lease_id: kv.lease(),
                    lease_remaining,
                    lease_ttl,
                    role: Role::of(kv.value()),
                    holds,
                    writes_since: revision - kv.create_revision(),
                    holder: super::kind::holder(kv.value()),
                });
            }
            states.push(LockState {
                name,
                revision,
                entries,
            });
        }
        Ok(states)
    }

    /// (remaining, granted) TTL of lease `id`; `(None, None)` once it has expired.
    async fn lease_ttls(
        &self,
        id: i64,
        lock: Option<&str>,
    ) -> Result<(Option<Duration>, Option<Duration>), LockError> {
        let timeout = self.config().request_timeout;
        let client = self.client();
        let answer = call_retrying("inspect lease", lock, timeout, self.renewal(), || {
            let mut lease = client.lease_client();
            async move { lease.time_to_live(id, None::<LeaseTimeToLiveOptions>).await }
        })
        .await?;
        // etcd answers -1 for a lease that no longer exists.
        let seconds = |s: i64| u64::try_from(s).ok().map(Duration::from_secs);
        match seconds(answer.ttl()) {
            Some(remaining) => Ok((Some(remaining), seconds(answer.granted_ttl()))),
            None => Ok((None, None)),
        }
    }
}
