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
    /// How long a majority of the masters keeps holding it: the remaining `PX` of the
    /// copy whose expiry leaves fewer than a quorum (the quorum-th longest); `None` if
    /// that many copies never expire, or fewer than a quorum were found.
    pub remaining: Option<Duration>,
    /// Whether a majority of the masters hold it: only then is the lock held.
    pub quorum: bool,
    /// Not held by a majority of the masters read, but it might be: the masters that
    /// could not be read would make a majority with those that hold it.
    pub undecided: bool,
    /// Each copy's remaining `PX` (`None`: no expiry), for `remaining`.
    copies: Vec<Option<Duration>>,
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
        let unreachable = found.unreachable.len();
        for holder in &mut found.holders {
            holder.quorum = holder.masters.len() >= core.quorum;
            holder.undecided = !holder.quorum && holder.masters.len() + unreachable >= core.quorum;
            holder.remaining = majority_remaining(&holder.copies, core.quorum);
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
                holder.copies.push(remaining);
                if holder.holder.is_none() {
                    holder.holder = held.holder;
                }
            }
            None => found.holders.push(RedlockHolder {
                owner: held.owner,
                holder: held.holder,
                masters: vec![address.to_owned()],
                remaining: None,
                quorum: false,
                undecided: false,
                copies: vec![remaining],
            }),
        }
    }
}

/// How long at least `quorum` of `copies` (each a remaining `PX`, `None`: no expiry) stay:
/// the quorum-th longest; `None` if that many never expire or there are fewer copies.
fn majority_remaining(copies: &[Option<Duration>], quorum: usize) -> Option<Duration> {
    if quorum == 0 || copies.len() < quorum {
        return None;
    }
    let mut left: Vec<Option<Duration>> = copies.to_vec();
    // Longest first, a copy without expiry longest of all.
    left.sort_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(a),
    });
    left[quorum - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_stays_as_long_as_its_quorum_th_longest_copy() {
        let s = |ms| Some(Duration::from_millis(ms));
        // Five masters, quorum 3: one copy whose renewal failed does not end the lock.
        assert_eq!(
            majority_remaining(&[s(1000), s(9000), s(9100), s(8900), s(9050)], 3),
            s(9000)
        );
        assert_eq!(majority_remaining(&[s(1000), s(9000)], 2), s(1000));
        assert_eq!(majority_remaining(&[None, None, s(500)], 2), None);
        assert_eq!(majority_remaining(&[None, s(700), s(500)], 2), s(700));
        assert_eq!(majority_remaining(&[s(700)], 2), None);
    }
}
