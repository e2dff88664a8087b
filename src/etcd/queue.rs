//! Where a key stands in its lock's queue, and waiting for its turn.
//!
//! Every primitive queues the same way: the join reads every key ahead (all of them are
//! older than the new key, which is the newest in the store), and [`Kind::admitted`] says
//! whether those keys let this one hold the lock. Keys ahead only ever leave (a newcomer
//! queues behind), so after the join a waiter needs no further read: it follows the
//! deletions of the session's watch of the lock (`watch_hub.rs`), crosses out the keys
//! that leave, and holds the lock once the keys left admit it. A handoff therefore costs
//! the holder's delete and the watch event, not one more read.
//!
//! Two rules keep this exact:
//!
//! - the watch must deliver every deletion after the read the waiter started from: the
//!   waiter subscribed before that read, and the watch was created at or before its
//!   revision (otherwise the waiter reads again, once the watch is in place);
//! - a deletion at or before that revision is older than the waiter's picture and is
//!   ignored: key names are reused (`slots.rs`), and an old deletion of a name must not
//!   cross out the key that now carries it.
//!
//! A deletion of the waiter's own key (its lease expired or was revoked) ends the wait:
//! the key is gone, and the lock must not be granted on it (the Jepsen finding on etcd
//! 3.4.3: Go's client now re-checks its key after waiting).

use std::collections::HashMap;

use etcd_client::{GetOptions, KeyValue};

use super::acquire::{Acquisition, Backoff, Joined, revision_of};
use super::kind::Kind;
use super::watch_hub::Subscription;
use crate::{FencingToken, LockError};

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
    /// What a read of the queue must return for this kind: every key, with its value
    /// where the kind looks at values (readers, permits).
    pub(super) fn queue_read(&self) -> GetOptions {
        let read = GetOptions::new();
        match self.kind {
            Kind::Reader | Kind::Permit { .. } => read,
            Kind::Mutex | Kind::Writer | Kind::Candidate { .. } => read.with_keys_only(),
        }
    }

    /// Joins the queue: my key, and every key ahead of it in the same revision. Returns
    /// my token, my place, and the revision the place was read at.
    pub(super) async fn enqueue(&self, key: &str) -> Result<(FencingToken, Place, i64), LockError> {
        match self.join(key, self.queue_read()).await? {
            Joined::Now { token, read } => {
                Ok((token, self.place(token, read.kvs()), token.as_revision()))
            }
            // An earlier attempt of the join went through: read my place now.
            Joined::Earlier(token) => self.read_place(token).await.map(|(p, r)| (token, p, r)),
        }
    }

    /// Reads my place (the keys up to mine), and the revision it was read at.
    pub(super) async fn read_place(&self, token: FencingToken) -> Result<(Place, i64), LockError> {
        let read = self.read_up_to(token, self.queue_read()).await?;
        Ok((self.place(token, read.kvs()), revision_of(&read)))
    }

    /// My place, from the keys up to and including mine.
    fn place(&self, token: FencingToken, keys: &[KeyValue]) -> Place {
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

    /// Waits until the keys ahead admit mine; see the module docs. `known` is the place
    /// read at the join, with its revision, when `watch` was subscribed before that read
    /// (otherwise deletions between the read and the subscription could be missed: the
    /// wait reads again once the watch is in place).
    pub(super) async fn wait_in_line(
        &self,
        token: FencingToken,
        key: &str,
        known: Option<(Ahead, i64)>,
        mut watch: Subscription,
    ) -> Result<(), LockError> {
        let hub = &self.inner().hub;
        let mut backoff = Backoff::new();
        let mut known = known;
        loop {
            let Some(created) = watch.ready().await else {
                // Cancelled by the server or the stream broke: watch and read again.
                backoff.wait().await;
                watch = hub.subscribe(&self.prefix);
                known = None;
                continue;
            };
            let (mut ahead, as_of) = match known.take() {
                Some((ahead, revision)) if created <= revision => (ahead, revision),
                _ => match self.read_place(token).await {
                    Ok((Place::Head, _)) => return Ok(()),
                    Ok((Place::Gone, _)) => return Err(self.lost_while_waiting()),
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
            // Cross out the keys that leave, until those left admit mine (or the watch
            // ends: then the top watches and reads again).
            while let Some((deleted, revision)) = watch.next_deletion().await {
                if revision <= as_of {
                    continue;
                }
                if deleted == key.as_bytes() {
                    return Err(self.lost_while_waiting());
                }
                if ahead.remove(&deleted).is_some()
                    && self.kind.admitted(ahead.values().map(Vec::as_slice))
                {
                    return Ok(());
                }
            }
        }
    }
}
