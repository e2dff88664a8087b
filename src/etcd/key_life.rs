//! The life of one acquisition's lock key, from its name to its deletion: every request
//! the library sends about a key is made here, so that the rules that keep requests from
//! harming other acquisitions hold in one place.
//!
//! etcd gives no guarantee that a confirmed request proves an earlier attempt of it dead:
//! an attempt that got no answer (a timeout, a connection that broke after sending) may
//! be applied later, after a retry through another member was confirmed, after the
//! caller gave up (`etcdserver/v3_server.go`: a follower forwards a proposal to the leader
//! whatever becomes of its client). What etcd does give: one request is applied at most
//! once (one gRPC call is one proposal; neither etcd-client nor tonic retries a call), so
//! a request whose only attempt was answered has no copy left anywhere. So:
//!
//! - **A key name is reused only once every request about its previous key was answered**
//!   (`slots.rs`): then nothing sent for that key can still land, and a plain delete of
//!   exactly the key (what etcd's own Unlock does, and cheaper than a transaction guarded
//!   by the create revision) can never meet another acquisition's key. A request about a
//!   key that got no answer (a join, a release, a cleanup) *spends* its name: the name is
//!   never used again in that session, so a late copy of the request can only meet the key
//!   it was sent for.
//! - **A join whose fate is unknown retires its session** ([`SessionInner::retire`]): the
//!   join may still create the key later, after every cleanup, under a lease the process
//!   keeps renewing. A retired session takes no new acquisition, and its lease is revoked
//!   once its last guard goes, which deletes any such key (a put carrying a revoked lease
//!   fails whole when it is finally applied: `apply.go` `checkRequestPut`). The key's
//!   name is never given back, so no later acquisition can mistake the late key for its
//!   own, and until the lease goes the session sweeps that name (`late_joins.rs`): a late
//!   key is deleted within about a second, not left until the session's last guard.
//! - **A name whose key may still exist is never given back**, whatever the reason the
//!   key could not be removed: a delete refused ("permission denied": the role lost its
//!   write permission while the lock was held) leaves the key under the live lease. Such
//!   a key retires its session (so its lease goes with the session's last guard) and is
//!   swept (`late_joins.rs`) until a delete gets through. A name given back would be
//!   found holding the old key by the next acquisition, whose join would read it back as
//!   its own: the earlier grant's token handed out again.
//! - **A join never adopts a key it did not create**: when a join finds its key already
//!   there, it takes it for its own only if an earlier attempt of this very join got no
//!   answer, the key holds this acquisition's value (its kind), and its create revision
//!   is above the newest confirmed delete of the session when the name was taken
//!   ([`Slots::deleted_through`](super::slots::Slots::deleted_through): any earlier key
//!   under the name was made before that delete). Otherwise the acquisition fails and the
//!   session is retired.
//!
//! Joins and deletes go out through the session's group commit (`batch.rs`): batched, a
//! request is the same request, one member of one transaction that is applied whole or
//! not at all, so every rule above holds per member (a batch without an answer leaves
//! every member's fate unknown).
//!
//! One other request creates keys: the join of several locks in one transaction
//! (`lock_all.rs`), sent alone. It keeps the same rules for every key it carries: each
//! key's name is a slot as above, an attempt without an answer marks every key's join
//! unknown (spending every name, retiring the session, and the sweep covers every key),
//! and it adopts no key at all: a retry that finds keys already there fails the whole
//! acquisition after removing them.
//!
//! One other request deletes keys: the release of several locks held together
//! ([`QueueKey::delete_all`], `release_all.rs`), one transaction of plain deletes of
//! exactly each key, sent alone. It is a request about every key it carries: an attempt
//! without an answer spends every name, and each key's answer (its own delete's count,
//! the transaction's revision) goes through the same bookkeeping as a single delete's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use etcd_client::{GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};
use tokio::time::Duration;

use super::batch::Ticket;
use super::call::{Attempts, call_retrying_noting, malformed};
use super::keys::{self, LockPath};
#[cfg(feature = "testkit")]
use super::observed::{self, UNANSWERED};
use super::request::{Answer, Request};
use super::session::{Session, SessionInner};
use crate::{FencingToken, LockError};

/// One acquisition's key: its name (a slot of its session), what it holds, and whether
/// any request about it has an unknown outcome.
#[derive(Debug)]
pub(super) struct QueueKey {
    pub(super) session: Session,
    /// The lock's prefix, `<namespace>/<name>/`, and its name: shared with the session's
    /// slot table, this acquisition's requests and its watch.
    pub(super) path: LockPath,
    /// The full key, `<prefix><lease>-<slot>`, shared with its requests and its watch.
    pub(super) key: Arc<str>,
    slot: u64,
    /// What the key holds: the kind's marker, or an election candidate's value.
    value: Vec<u8>,
    /// A join of this key got no answer: it may still be created later (the session is
    /// retired).
    join_unknown: bool,
    /// Some request about this key got no answer: the name is never given back.
    spent: AtomicBool,
    /// The join's place in the session's batcher: withdrawn before it was sent, it can
    /// never land.
    join_ticket: Option<Arc<Ticket>>,
    /// Every key an earlier acquisition made under this name has a create revision at
    /// or below this one (see the module docs).
    floor: i64,
}

/// What joining the queue found.
pub(super) enum Joined {
    /// The key was put now, and this is the read made in the same revision.
    Now {
        token: FencingToken,
        read: GetResponse,
    },
    /// An earlier attempt of the same request put it: its token, nothing read.
    Earlier(FencingToken),
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Deleted {
    /// The key was there and is gone now.
    pub(super) removed: bool,
    /// Some attempt got no answer: when nothing was removed, an earlier attempt may have
    /// been the one that removed it.
    pub(super) ambiguous: bool,
    /// The store revision the answer was read at: the key is gone at it.
    pub(super) revision: Option<i64>,
}

impl QueueKey {
    /// A key for a new acquisition of lock `name` on `session`, holding `value`.
    pub(super) fn take(session: Session, name: &str, value: Vec<u8>) -> Self {
        let namespace = &session.inner.config.namespace;
        let (prefix, slot) = session
            .inner
            .slots
            .take(&keys::lock_prefix(namespace, name));
        // Read after the take: the delete that freed the slot was recorded before it was
        // given back.
        let floor = session.inner.slots.deleted_through();
        let key = keys::waiter_key(&prefix, session.inner.lease_id(), slot).into();
        let path = LockPath::new(prefix, namespace);
        Self {
            session,
            path,
            key,
            slot,
            value,
            join_unknown: false,
            spent: AtomicBool::new(false),
            join_ticket: None,
            floor,
        }
    }

    /// Moves the key out for a release that outlives its guard, leaving a husk behind
    /// (sharing its names; the guard is marked released and never sends a request about
    /// it again).
    pub(super) fn detach(&mut self) -> Self {
        let detached = Self {
            session: self.session.clone(),
            path: self.path.clone(),
            key: self.key.clone(),
            slot: self.slot,
            value: std::mem::take(&mut self.value),
            join_unknown: self.join_unknown,
            spent: AtomicBool::new(self.spent.load(Ordering::Acquire)),
            join_ticket: self.join_ticket.clone(),
            floor: self.floor,
        };
        // The husk shares the key's names, and the release that goes on may leave the
        // name spent: the husk must never give the slot back.
        self.spend();
        detached
    }

    /// The lock's name.
    pub(super) fn name(&self) -> &str {
        self.path.name()
    }

    /// The lock's prefix, `<namespace>/<name>/`.
    pub(super) fn prefix(&self) -> &Arc<str> {
        self.path.prefix()
    }

    pub(super) fn inner(&self) -> &SessionInner {
        &self.session.inner
    }

    /// What the key is to hold (until its join is answered).
    pub(super) fn value(&self) -> &[u8] {
        &self.value
    }

    /// The join was answered and put the key: the value is not needed to recognise it
    /// any more (see [`create`](Self::create)).
    pub(super) fn forget_value(&mut self) {
        self.value = Vec::new();
    }

    /// Whether some attempt to create the key got no answer.
    pub(super) fn join_unknown(&self) -> bool {
        self.join_unknown
    }

    /// Records that a join of this key may still land (its call was dropped, or an attempt
    /// got no answer): the session is retired and the name never given back.
    pub(super) fn mark_join_unknown(&mut self) {
        if !self.join_unknown {
            tracing::debug!(
                key = &*self.key,
                "join outcome unknown; retiring the session"
            );
            #[cfg(feature = "testkit")]
            UNANSWERED.joins.fetch_add(1, Ordering::Relaxed);
            self.join_unknown = true;
            self.spend();
            self.inner().retire();
        }
    }

    /// Withdraws the join if it is still queued in the session's batcher: true means it
    /// was never sent, so no key can come of it.
    fn withdraw_join(&self) -> bool {
        self.join_ticket
            .as_ref()
            .is_some_and(|ticket| ticket.withdraw())
    }

    /// A request about this key got no answer: its name is never used again.
    pub(super) fn spend(&self) {
        self.spent.store(true, Ordering::Release);
    }

    /// Whether some request about the key got no answer (its name is never given back).
    pub(super) fn is_spent(&self) -> bool {
        self.spent.load(Ordering::Acquire)
    }

    /// Joins the queue in one transaction: put the key (holding its value) under the
    /// lease, and run `read` over the lock's prefix in the same revision. The key is the
    /// newest in the whole store, so everything `read` returns is ahead of it, or it.
    ///
    /// The put is guarded by "the key does not exist yet", so the request can be retried
    /// after a connection failure: if an earlier attempt got through, the retry reads the
    /// key back instead (and checks it is this acquisition's), and the caller reads its
    /// place separately.
    pub(super) async fn create(&mut self, read: GetOptions) -> Result<Joined, LockError> {
        let ticket = Arc::new(Ticket::default());
        self.join_ticket = Some(ticket.clone());
        let inner = self.inner();
        let request = Request::Join {
            path: self.path.clone(),
            key: self.key.clone(),
            value: self.value.clone(),
            lease: inner.lease_id(),
            read,
        };
        let Attempts { result, ambiguous } = inner.batch.send(request, ticket).await;
        if ambiguous {
            // The ticket is kept: a batch task that stopped (`abandon`) leaves its queue
            // unclaimed, and a cleanup can still withdraw what was never sent.
            self.mark_join_unknown();
        } else {
            // Answered, so sent (the ticket is claimed for good): nothing is left to
            // withdraw, and a held lock need not keep the ticket.
            self.join_ticket = None;
        }
        let joined = match result? {
            Answer::Join {
                succeeded,
                responses,
                revision,
            } => self.joined(succeeded, responses, revision),
            Answer::Delete { .. } => Err(malformed(
                "acquire",
                Some(self.name()),
                "a delete's answer for a join",
            )),
        };
        if joined.is_err() {
            // Answered, so applied, but not as this acquisition's key: whatever is there
            // must not be taken for it, nor its name reused.
            self.mark_join_unknown();
        } else {
            // The value served to recognise the key on a retry: a held lock need not keep
            // it (a client may hold 100,000 locks; the holder record is ~100 bytes).
            self.value = Vec::new();
        }
        joined
    }

    /// What the join's answer says: whether it put the key, the answers of its own
    /// operations, and the store revision right after the transaction that carried it
    /// (the token, if the key was put).
    fn joined(
        &self,
        succeeded: bool,
        responses: Vec<TxnOpResponse>,
        revision: Option<i64>,
    ) -> Result<Joined, LockError> {
        let name = Some(self.name());
        let header = revision;
        let mut responses = responses.into_iter();
        if !succeeded {
            let existing = match responses.next() {
                Some(TxnOpResponse::Get(mine)) => mine.kvs().first().cloned(),
                _ => None,
            };
            let existing =
                existing.ok_or_else(|| malformed("acquire", name, "existing key not returned"))?;
            // Never adopt a key this join cannot prove it made (see the module docs): only
            // an attempt without an answer can have put it, and only after the name was
            // taken; a key of another kind would make a reader's key a writer's.
            let why = if !self.join_unknown {
                Some("although every attempt to create it was answered")
            } else if existing.value() != self.value.as_slice() {
                Some("with another value")
            } else if existing.create_revision() <= self.floor {
                Some("from before its name was taken")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(LockError::Backend {
                    backend: crate::Backend::Etcd,
                    operation: "acquire",
                    lock: Some(self.name().to_owned()),
                    source: format!(
                        "key {} already exists {why}; the session is retired",
                        self.key
                    )
                    .into(),
                });
            }
            let token = FencingToken::from_revision(existing.create_revision())
                .ok_or_else(|| malformed("acquire", name, "existing key without revision"))?;
            #[cfg(feature = "testkit")]
            UNANSWERED.adopted.fetch_add(1, Ordering::Relaxed);
            return Ok(Joined::Earlier(token));
        }
        let token = header
            .and_then(FencingToken::from_revision)
            .ok_or_else(|| malformed("acquire", name, "missing header revision"))?;
        match responses.nth(1) {
            Some(TxnOpResponse::Get(read)) => Ok(Joined::Now { token, read }),
            _ => Err(malformed("acquire", name, "missing range result")),
        }
    }

    /// Deletes exactly the key, retried through other members. If some attempt got no
    /// answer its name is spent (see the module docs), and a late attempt can only ever
    /// delete this key; see [`Deleted`].
    pub(super) async fn delete(&self) -> Result<Deleted, LockError> {
        let inner = self.inner();
        let request = Request::Delete {
            path: self.path.clone(),
            key: self.key.clone(),
        };
        let ticket = Arc::new(Ticket::default());
        let Attempts { result, ambiguous } = inner.batch.send(request, ticket).await;
        if ambiguous {
            #[cfg(feature = "testkit")]
            UNANSWERED.deletes.fetch_add(1, Ordering::Relaxed);
            self.spend();
        }
        let (removed, revision) = match result? {
            Answer::Delete { deleted, revision } => (deleted > 0, revision),
            Answer::Join { .. } => {
                return Err(malformed(
                    "release",
                    Some(self.name()),
                    "a join's answer for a delete",
                ));
            }
        };
        #[cfg(feature = "testkit")]
        if removed {
            observed::deleted(self.key.as_bytes(), revision);
        }
        Ok(Deleted {
            removed,
            ambiguous,
            revision,
        })
    }

    /// Deletes exactly each of `keys` (keys of one session, each once) in **one**
    /// transaction: one request, one Raft proposal, sent alone and retried through other
    /// members as [`delete`](Self::delete) is. No compare is needed: each name is used by
    /// one acquisition while any request about it may still land (see the module docs),
    /// so a late attempt can only ever delete the keys it was sent for. If some attempt got
    /// no answer every name is spent. Answered, each key gets its own [`Deleted`] (its
    /// delete's count, the transaction's revision), in the order of `keys`; the caller
    /// then records each as [`deleted`](Self::deleted).
    pub(super) async fn delete_all(keys: &[&Self]) -> Result<Vec<Deleted>, LockError> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let inner = first.inner();
        let label = keys.iter().map(|k| k.name()).collect::<Vec<_>>().join(",");
        let build = || {
            let deletes: Vec<TxnOp> = keys.iter().map(|k| TxnOp::delete(&*k.key, None)).collect();
            Txn::new().and_then(deletes)
        };
        // Built again for a retry rather than cloned for every attempt.
        let mut first_txn = Some(build());
        let Attempts { result, ambiguous } = call_retrying_noting(
            "release",
            Some(&label),
            inner.config.request_timeout,
            &inner.renewal,
            || {
                let mut kv = inner.kv.clone();
                let txn = first_txn.take().unwrap_or_else(build);
                async move { kv.txn(txn).await }
            },
        )
        .await;
        if ambiguous {
            for key in keys {
                #[cfg(feature = "testkit")]
                UNANSWERED.deletes.fetch_add(1, Ordering::Relaxed);
                key.spend();
            }
        }
        let answer = result?;
        let revision = answer.header().map(|h| h.revision());
        let responses = answer.op_responses();
        if !answer.succeeded() || responses.len() != keys.len() {
            return Err(malformed(
                "release",
                Some(&label),
                "a delete's answer missing from the transaction's",
            ));
        }
        let mut deleted = Vec::with_capacity(keys.len());
        for (key, response) in keys.iter().zip(responses) {
            let TxnOpResponse::Delete(response) = response else {
                return Err(malformed(
                    "release",
                    Some(key.name()),
                    "not a delete's answer",
                ));
            };
            let removed = response.deleted() > 0;
            #[cfg(feature = "testkit")]
            if removed {
                observed::deleted(key.key.as_bytes(), revision);
            }
            deleted.push(Deleted {
                removed,
                ambiguous,
                revision,
            });
        }
        Ok(deleted)
    }

    /// The key's delete is confirmed: its name is given back, unless some request about
    /// it got no answer; if its join may still land (a first attempt without an answer,
    /// whatever a retry found), the session sweeps that name while it lives, or a late
    /// key would block the lock under a lease other guards keep renewing.
    pub(super) fn deleted(&self, deleted: Deleted) {
        if let Some(revision) = deleted.revision {
            self.inner().slots.deleted_at(revision);
        }
        self.give_back();
        if self.join_unknown {
            super::late_joins::sweep(&self.session.inner, self.name(), &self.key);
        }
    }

    /// The key is confirmed gone (or was never made): its name may serve the next
    /// acquisition, unless some request about it got no answer.
    pub(super) fn give_back(&self) {
        if !self.spent.load(Ordering::Acquire) {
            self.inner().slots.give_back(self.prefix(), self.slot);
        }
    }

    /// Deletes the key, retrying until etcd confirms it or the session is gone (its lease
    /// then takes the key with it), then gives its name back. On a shared, renewed session
    /// a key left behind would block the lock for as long as the process lives.
    pub(super) async fn remove(&self) -> Option<Deleted> {
        let inner = self.inner();
        let mut backoff = Backoff::new();
        while inner.is_alive() {
            match self.delete().await {
                Ok(deleted) => {
                    self.deleted(deleted);
                    return Some(deleted);
                }
                Err(err) if err.is_permission_denied() => {
                    // The key stays, under a lease the session renews: its name is never
                    // given back (a later acquisition would find the old key under it),
                    // the session takes no new acquisition (its lease goes with its last
                    // guard), and the key is swept until a delete is allowed.
                    tracing::warn!(%err, key = &*self.key, "our key's delete was refused; retiring the session and sweeping the key");
                    self.spend();
                    self.inner().retire();
                    super::late_joins::sweep(&self.session.inner, self.name(), &self.key);
                    return None;
                }
                Err(err) => {
                    tracing::debug!(%err, key = &*self.key, "could not remove our key; retrying");
                    backoff.wait().await;
                }
            }
        }
        tracing::debug!(key = &*self.key, "session gone: its lease removes our key");
        None
    }
}

/// Removes a key whose acquisition was dropped before it could: armed while the key may
/// exist with nobody else to remove it. Dropped armed, it removes the key in the
/// background; if the key's join had no answer yet, that join may still land, so the
/// session is retired first; if a removal attempt was in flight, it may still land, so the
/// name is spent.
pub(super) struct Cleanup {
    key: Option<QueueKey>,
    /// The join was answered.
    answered: bool,
    /// A removal attempt was sent.
    attempting: bool,
}

impl Cleanup {
    /// Armed for `key`, whose join is not answered yet.
    pub(super) fn joining(key: QueueKey) -> Self {
        Self {
            key: Some(key),
            answered: false,
            attempting: false,
        }
    }

    /// Armed for `key`, whose join was answered.
    pub(super) fn joined(key: QueueKey) -> Self {
        Self {
            key: Some(key),
            answered: true,
            attempting: false,
        }
    }

    /// The key, while armed.
    pub(super) fn key(&self) -> Option<&QueueKey> {
        self.key.as_ref()
    }

    /// The key, while armed (to create it).
    pub(super) fn key_mut(&mut self) -> Option<&mut QueueKey> {
        self.key.as_mut()
    }

    /// The join is answered.
    pub(super) fn created(&mut self) {
        self.answered = true;
    }

    /// Takes the key back: someone else (a guard, a waiting task) is responsible now.
    pub(super) fn disarm(&mut self) -> Option<QueueKey> {
        self.key.take()
    }

    /// Removes the key, answering within `allowance`; if etcd does not confirm it by then
    /// (or this future is dropped), the removal goes on in the background.
    pub(super) async fn leave(mut self, allowance: Duration) {
        self.attempting = true;
        let Some(key) = self.key.as_ref() else {
            return;
        };
        if tokio::time::timeout(allowance, key.remove()).await.is_ok() {
            self.key = None;
        } else {
            tracing::warn!(key = &*key.key, "queue entry not removed yet; still trying");
            // Dropped armed: the removal goes on in the background.
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(mut key) = self.key.take() else {
            return;
        };
        if !self.answered {
            if key.withdraw_join() {
                // Dropped while its join waited to be batched: nothing was sent, nothing
                // can land, nothing is there to remove.
                key.give_back();
                return;
            }
            // Dropped while the join was in flight: it may still land.
            key.mark_join_unknown();
        }
        if self.attempting {
            // A removal attempt given up on may still land.
            key.spend();
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                key.remove().await;
            });
        }
    }
}

/// Delay between retries after a failure, doubling from 50 ms to 1 s.
pub(super) struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);

    pub(super) fn new() -> Self {
        Self(Self::FIRST)
    }

    pub(super) fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    pub(super) async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}
