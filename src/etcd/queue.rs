//! Where a key stands in its lock's queue, and waiting for its turn.
//!
//! Every primitive queues the same way: the join reads every key ahead (all of them are
//! older than the new key, which is the newest in the store), and [`Kind::admitted`] says
//! whether those keys let this one hold the lock. Keys ahead only ever leave (a newcomer
//! queues behind), so after the join a waiter needs no further read: it follows the
//! deletions of the client's watch of the lock (`watch_hub.rs`), crosses out the keys
//! that leave, and holds the lock once the keys left admit it. A handoff therefore costs
//! the holder's delete and the watch event, not one more read.
//!
//! Three rules keep this exact:
//!
//! - the watch must deliver every deletion after the read the waiter started from: the
//!   waiter subscribed before that read and the watch covers it (the subscription says
//!   from which revision: `watch_state.rs`), otherwise the waiter reads again once the
//!   watch is in place;
//! - a deletion at or before that revision is older than the waiter's picture and is
//!   ignored: key names are reused (`slots.rs`), and an old deletion of a name must not
//!   cross out the key that now carries it;
//! - a waiter decides on whole revisions: one revision can delete many keys (an operator's
//!   prefix delete, a revoked lease shared by several keys), and a waiter whose own key
//!   went in the same revision as the keys ahead of it is not granted.
//!
//! A deletion of the waiter's own key ends the wait: the key is gone, and the lock must
//! not be granted on it (the Jepsen finding on etcd 3.4.3: Go's client now re-checks its
//! key after waiting).

use std::collections::HashMap;

use etcd_client::KeyValue;

use super::acquire::{Acquisition, revision_of};
use super::key_life::{Backoff, QueueKey};
use super::watch_hub::{EndReason, Heard, Subscription, TrackedKey};
use crate::{Backend, FencingToken, LockError};

/// The keys ahead of mine (name -> value).
pub(super) type Ahead = HashMap<Vec<u8>, Vec<u8>>;

/// Where my key stands in the queue of one lock.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// The keys ahead admit mine: the lock (or a permit, or a read) is mine.
    Head,
    /// These keys are ahead and hold mine back.
    Behind(Ahead),
    /// My key is gone (its lease expired or was revoked, or someone deleted it).
    Gone,
}

impl Acquisition {
    /// Reads my place (the keys up to mine), and the revision it was read at.
    pub(super) async fn read_place(
        &self,
        key: &QueueKey,
        token: FencingToken,
    ) -> Result<(Place, i64), LockError> {
        let read = self.read_up_to(key, token, self.queue_read()).await?;
        Ok((self.place(token, read.kvs()), revision_of(&read)))
    }

    /// My place, from the keys up to and including mine.
    pub(super) fn place(&self, token: FencingToken, keys: &[KeyValue]) -> Place {
        let mine = keys
            .iter()
            .any(|kv| FencingToken::from_revision(kv.create_revision()) == Some(token));
        if !mine {
            return Place::Gone;
        }
        let ahead: Ahead = keys
            .iter()
            .filter(|kv| kv.create_revision() < token.as_revision())
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect();
        if self.kind.admitted(ahead.values().map(Vec::as_slice)) {
            Place::Head
        } else {
            Place::Behind(ahead)
        }
    }

    /// Waits until the keys ahead admit mine; see the module docs. Returns the revision
    /// up to which my key is known alive. `known` is the place read at the join, with its
    /// revision, when `watch` was subscribed before that read. `tracked` is my key on the
    /// lock's watch (followed from here on if it was not yet).
    pub(super) async fn wait_in_line(
        &self,
        key: &QueueKey,
        token: FencingToken,
        known: Option<(Ahead, i64)>,
        mut watch: Subscription,
        tracked: &mut Option<TrackedKey>,
    ) -> Result<i64, LockError> {
        let mut backoff = Backoff::new();
        let mut known = known;
        let mut covered = None;
        loop {
            let coverage = match covered {
                Some(coverage) => coverage,
                None => match watch.next().await {
                    Heard::Covered(revision) => {
                        covered = Some(revision);
                        if tracked.is_none() {
                            // The watch exists now: follow the key on it too.
                            *tracked = self.hub.track(key.prefix(), &key.key);
                            if let Some(tracked) = tracked.as_ref() {
                                tracked.settle(token.as_revision());
                            }
                        }
                        revision
                    }
                    // Deletions before the watch covers anything precede the read after.
                    Heard::Deleted(..) => continue,
                    Heard::Ended(end) => {
                        // Until a watch is back, read the queue (with a pause) instead.
                        if let Some(revision) =
                            self.watch_ended(key, token, end, &mut backoff).await?
                        {
                            return Ok(revision);
                        }
                        watch = self.hub.subscribe(key.prefix());
                        known = None;
                        continue;
                    }
                },
            };
            let (mut ahead, as_of) = match known.take() {
                Some((ahead, revision)) if coverage <= revision => (ahead, revision),
                _ => match self.read_place(key, token).await {
                    Ok((Place::Head, revision)) => return Ok(revision),
                    Ok((Place::Gone, revision)) => {
                        return Err(self.key_gone_checked(key, Some((token, revision))).await);
                    }
                    Ok((Place::Behind(ahead), revision)) => {
                        backoff.reset();
                        (ahead, revision)
                    }
                    // A leader election or a member going down: keep our place and retry.
                    // The session's loss and the wait timeout bound how long.
                    Err(err) if err.is_unavailable() => {
                        tracing::debug!(%err, "queue read failed; retrying");
                        backoff.wait().await;
                        continue;
                    }
                    Err(err) => return Err(err),
                },
            };
            // Cross out the keys that leave, a whole revision at a time, until those left
            // admit mine (or the watch ends: then read again and follow anew).
            loop {
                match watch.next().await {
                    Heard::Deleted(revision, deleted) => {
                        if revision <= as_of {
                            continue;
                        }
                        if deleted.iter().any(|gone| gone == key.key.as_bytes()) {
                            return Err(self.key_gone_checked(key, Some((token, revision))).await);
                        }
                        let mut left = false;
                        for gone in &deleted {
                            left |= ahead.remove(gone).is_some();
                        }
                        if left && self.kind.admitted(ahead.values().map(Vec::as_slice)) {
                            return Ok(revision);
                        }
                    }
                    Heard::Covered(_) => {}
                    Heard::Ended(end) => {
                        if let Some(revision) =
                            self.watch_ended(key, token, end, &mut backoff).await?
                        {
                            return Ok(revision);
                        }
                        watch = self.hub.subscribe(key.prefix());
                        covered = None;
                        known = None;
                        break;
                    }
                }
            }
        }
    }

    /// The watch stopped serving this wait: a refusal is the caller's error; otherwise
    /// the place is read now (after a pause), so that a lock freed while no watch works is
    /// still granted. Returns the read's revision if the lock is mine.
    async fn watch_ended(
        &self,
        key: &QueueKey,
        token: FencingToken,
        end: EndReason,
        backoff: &mut Backoff,
    ) -> Result<Option<i64>, LockError> {
        match end {
            EndReason::Refused(why) => Err(LockError::PermissionDenied {
                backend: Backend::Etcd,
                operation: "watch",
                lock: Some(key.name().to_owned()),
                message: why,
            }),
            // Waiting on would be waiting for ever (or for the wait timeout): nothing
            // delivers deletions to this client any more.
            EndReason::Stopped => Err(LockError::Backend {
                backend: Backend::Etcd,
                operation: "watch",
                lock: Some(key.name().to_owned()),
                source: "the client's watch task stopped; connect a new EtcdLocker".into(),
            }),
            EndReason::Gap(why) => {
                tracing::debug!(%why, "lock watch ended; reading the queue");
                backoff.wait().await;
                match self.read_place(key, token).await {
                    Ok((Place::Head, revision)) => Ok(Some(revision)),
                    Ok((Place::Gone, revision)) => {
                        Err(self.key_gone_checked(key, Some((token, revision))).await)
                    }
                    Ok((Place::Behind(_), _)) => Ok(None),
                    Err(err) if err.is_unavailable() => Ok(None),
                    Err(err) => Err(err),
                }
            }
        }
    }
}
