//! A Redlock lock seen from outside: what each master holds of it, put together. The
//! lock is held by an owner value only while a majority of the masters hold it; a
//! minority's copy is a partial grant (being undone, or expiring) or a master that
//! missed a release.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::future::join_all;

use super::inspect::{RedisLockState, glob_escape, scan, state};
use super::locker::RedlockLocker;
use crate::{HolderInfo, LockError, validate_name};

/// One owner value found on some of the masters.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedlockHolder {
    /// The holder's owner value (`RedisGuard::owner`).
    pub owner: String,
    /// Who holds, as the holder recorded itself (`None`: it recorded nothing).
    pub holder: Option<HolderInfo>,
    /// The addresses of the masters whose key holds this owner value.
    pub masters: Vec<String>,
    /// The least of those keys' remaining `PX`; `None` if none of them expires.
    pub remaining: Option<Duration>,
    /// Whether a majority of the masters hold it: only then is the lock held.
    pub quorum: bool,
}

/// What the masters that answered know of one Redlock lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedlockLockState {
    /// The lock's name.
    pub name: String,
    /// Each owner value some master holds, those a majority hold first.
    pub holders: Vec<RedlockHolder>,
    /// The largest last token of the masters' counters (Redlock's token is the largest
    /// of the agreeing masters'); `None` before the first attempt.
    pub last_token: Option<u64>,
    /// The masters that could not be read.
    pub unreachable: Vec<String>,
}

impl RedlockLocker {
    /// What the masters hold of lock `name`: read on every master at once, answered
    /// when a majority could be read (a lock nobody holds has no holders).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "redlock"))]
    pub async fn inspect(&self, name: &str) -> Result<RedlockLockState, LockError> {
        validate_name(name)?;
        let core = self.core();
        let prefix = &core.config.prefix;
        let key = format!("{prefix}:lock:{name}");
        let reads = core
            .nodes
            .iter()
            .map(|node| state(node, prefix, name, false, vec![key.clone()]));
        let answers = join_all(reads).await;
        let mut found = RedlockLockState {
            name: name.to_owned(),
            holders: Vec::new(),
            last_token: None,
            unreachable: Vec::new(),
        };
        let mut first_error = None;
        let mut answered = 0;
        for (node, answer) in core.nodes.iter().zip(answers) {
            match answer {
                Ok(read) => {
                    answered += 1;
                    merge(&mut found, &node.address, read);
                }
                Err(err) => {
                    found.unreachable.push(node.address.clone());
                    first_error.get_or_insert(err);
                }
            }
        }
        if answered < core.quorum {
            if let Some(err) = first_error {
                return Err(err);
            }
        }
        for holder in &mut found.holders {
            holder.quorum = holder.masters.len() >= core.quorum;
        }
        found
            .holders
            .sort_by_key(|h| std::cmp::Reverse(h.masters.len()));
        Ok(found)
    }

    /// Every lock of this locker's prefix that some master holds, by name (each read as
    /// [`inspect`](Self::inspect) reads it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "redlock"))]
    pub async fn inspect_all(&self) -> Result<Vec<RedlockLockState>, LockError> {
        let core = self.core();
        let lock_prefix = format!("{}:lock:", core.config.prefix);
        let pattern = format!("{}*", glob_escape(&lock_prefix));
        let scans = join_all(core.nodes.iter().map(|node| scan(node, &pattern, None))).await;
        let mut names = BTreeSet::new();
        let mut first_error = None;
        let mut answered = 0;
        for keys in scans {
            match keys {
                Ok(keys) => {
                    answered += 1;
                    names.extend(
                        keys.iter()
                            .filter_map(|key| key.strip_prefix(&lock_prefix))
                            .map(str::to_owned),
                    );
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if answered < core.quorum {
            if let Some(err) = first_error {
                return Err(err);
            }
        }
        let mut states = Vec::with_capacity(names.len());
        for name in names {
            let found = self.inspect(&name).await?;
            // Keys may expire between the scan and the read.
            if !found.holders.is_empty() {
                states.push(found);
            }
        }
        Ok(states)
    }
}

/// Adds what the master at `address` holds to `found`.
fn merge(found: &mut RedlockLockState, address: &str, read: RedisLockState) {
    found.last_token = found.last_token.max(read.last_token);
    for held in read.holders {
        let remaining = held.remaining;
        match found.holders.iter_mut().find(|h| h.owner == held.owner) {
            Some(holder) => {
                holder.masters.push(address.to_owned());
                holder.remaining = match (holder.remaining, remaining) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if holder.holder.is_none() {
                    holder.holder = held.holder;
                }
            }
            None => found.holders.push(RedlockHolder {
                owner: held.owner,
                holder: held.holder,
                masters: vec![address.to_owned()],
                remaining,
                quorum: false,
            }),
        }
    }
}
