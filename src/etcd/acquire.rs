//! Taking an etcd lock: one transaction to join the queue, then FIFO waiting by watch.
//!
//! Every acquisition runs in a task of its own, and the caller awaits its answer. If the
//! caller goes away (its future dropped or timed out) the task notices and removes its key;
//! if a grant races with the drop, the guard that nobody receives releases the lock as it
//! is dropped.
//!
//! A key that leaves the queue without the lock (a `try_lock` miss, a wait timeout, an
//! error, a dropped call) is removed before the caller is answered, or, if etcd does not
//! confirm the removal within [`CLEANUP_ALLOWANCE`], in the background, retried until etcd
//! confirms it or the session is gone: the session's lease is renewed for as long as the
//! process lives, so a key left behind would block the lock until then. When the join
//! itself failed without an answer, it may still be applied later (a request in flight
//! through another member), after any removal; the session is then retired, so that its
//! lease, and the late key with it, is revoked once no lock uses it.

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use super::call::{call_retrying, malformed};
use super::guard::EtcdGuard;
use super::keys;
use super::kind::Kind;
use super::session::{Session, SessionInner};
use crate::{FencingToken, LockError, LossReason};

/// How long a caller's answer waits for its queue key to be removed; see the module docs.
/// A wait timeout returns at most this much later than the timeout.
pub(crate) const CLEANUP_ALLOWANCE: Duration = Duration::from_millis(250);

/// Whether to wait for the lock, and until when.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// Return at once if someone is ahead of us.
    Try,
    /// Wait in line; `timeout` bounds the whole acquisition, counted from its start.
    Wait { timeout: Option<Duration> },
}

/// Runs one acquisition in its own task and returns its outcome.
///
/// `owns_session`: the session was opened for this lock alone (no renewal) and ends with it.
/// `kind`: what the key stands for, which decides when it is admitted (see `kind.rs`).
/// `started`: when the caller's call began; a wait timeout counts from it.
pub(crate) async fn acquire(
    session: Session,
    owns_session: bool,
    name: &str,
    mode: Mode,
    kind: Kind,
    started: Instant,
) -> Result<Option<EtcdGuard>, LockError> {
    let (reply, answer) = oneshot::channel();
    let span = tracing::Span::current();
    let task = Acquisition {
        prefix: keys::lock_prefix(&session.inner.config.namespace, name),
        name: name.to_owned(),
        session,
        owns_session,
        started,
        value: kind.value(),
        kind,
    };
    tokio::spawn(task.run(mode, reply).instrument(span));
    answer.await.unwrap_or_else(|_| {
        Err(LockError::Backend {
            backend: crate::Backend::Etcd,
            operation: "acquire",
            lock: Some(name.to_owned()),
            source: "the acquisition task stopped (runtime shutting down?)".into(),
        })
    })
}

type Reply = oneshot::Sender<Result<Option<EtcdGuard>, LockError>>;

pub(super) struct Acquisition {
    pub(super) session: Session,
    owns_session: bool,
    pub(super) name: String,
    pub(super) prefix: String,
    started: Instant,
    pub(super) kind: Kind,
    /// What the key holds: the kind's marker, or an election candidate's value.
    pub(super) value: Vec<u8>,
}

/// Where my key stands in the queue of one lock.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// No key with a lower create revision: the lock is mine.
    Head,
    /// This key is the closest one ahead of mine.
    Behind(Vec<u8>),
    /// My key is gone (its lease expired or was revoked, or someone deleted it).
    Gone,
}

impl Acquisition {
    pub(super) fn inner(&self) -> &SessionInner {
        &self.session.inner
    }

    async fn run(self, mode: Mode, mut reply: Reply) {
        let slot = self.inner().slots.take(&self.prefix);
        let key = keys::waiter_key(&self.prefix, self.inner().lease_id(), slot);
        let joined = match self.kind {
            Kind::Reader => self.enqueue_shared(&key).await,
            Kind::Permit { .. } => self.enqueue_for_permit(&key).await,
            Kind::Mutex | Kind::Writer | Kind::Candidate { .. } => self.enqueue(&key).await,
        };
        let (token, place) = match joined {
            Ok(joined) => joined,
            // Refused: nothing was written (and could not be deleted either).
            Err(err) if err.is_permission_denied() => {
                self.inner().slots.give_back(&self.prefix, slot);
                let _ = reply.send(Err(err));
                return;
            }
            Err(err) => {
                // No answer does not mean not applied, now or later: see the module docs.
                // The key holds our lease id, so it can only be ours.
                tracing::debug!(%err, key, "join failed; retiring the session");
                self.inner().retire();
                return self.leave(&key, slot, reply, Err(err)).await;
            }
        };
        let outcome = match (place, mode) {
            (Place::Head, _) => Some(Ok(false)),
            (Place::Gone, _) => Some(Err(self.lost_while_waiting())),
            (Place::Behind(_), Mode::Try) => None,
            (Place::Behind(ahead), Mode::Wait { timeout }) => {
                let deadline = timeout.map(|t| self.started + t);
                let waiting = async {
                    match self.kind {
                        Kind::Reader => self.wait_shared(token).await,
                        Kind::Permit { .. } => self.wait_for_permit(token, &key).await,
                        Kind::Mutex | Kind::Writer | Kind::Candidate { .. } => {
                            self.wait_turn(token, ahead).await
                        }
                    }
                };
                tokio::select! {
                    waited = waiting => Some(waited.map(|()| true)),
                    _ = self.session.inner.lost() => Some(Err(self.lost_while_waiting())),
                    _ = sleep_until_opt(deadline) => Some(Err(LockError::WaitTimeout {
                        name: self.name.clone(),
                        waited: timeout.unwrap_or_default(),
                    })),
                    _ = reply.closed() => {
                        tracing::debug!("caller gave up waiting; leaving the queue");
                        return self.remove_until_confirmed(&key, slot).await;
                    }
                }
            }
        };
        match outcome {
            Some(Ok(waited)) => {
                tracing::debug!(%token, waited, "lock acquired");
                if self.owns_session {
                    // The lock's TTL counts from now, not from when it queued.
                    self.inner().stop_renewing(waited).await;
                }
                let guard =
                    EtcdGuard::new(self.session, self.owns_session, self.name, key, slot, token);
                // If the caller is gone, the guard comes back and its drop releases.
                let _ = reply.send(Ok(Some(guard)));
            }
            None => self.leave(&key, slot, reply, Ok(None)).await,
            Some(Err(err)) => self.leave(&key, slot, reply, Err(err)).await,
        }
    }

    /// Joins the queue in one transaction: put my key (holding `self.value`) under the
    /// lease, and run `read` over the lock's prefix in the same revision. My key is the
    /// newest in the whole store, so everything `read` returns is ahead of me, or mine.
    ///
    /// The put is guarded by "my key does not exist yet", so the request can be retried
    /// after a connection failure: if an earlier attempt got through, the retry reads my key
    /// back instead, and the caller reads its place separately.
    pub(super) async fn join(&self, key: &str, read: GetOptions) -> Result<Joined, LockError> {
        let inner = self.inner();
        let put = PutOptions::new().with_lease(inner.lease_id());
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, self.value.clone(), Some(put)),
                TxnOp::get(self.prefix.as_str(), Some(read.with_prefix())),
            ])
            .or_else([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let name = Some(self.name.as_str());
        let response = call_retrying("acquire", name, inner.config.request_timeout, || {
            let mut client = inner.kv.clone();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await?;
        let succeeded = response.succeeded();
        let header = response.header().map(|h| h.revision());
        let mut responses = response.op_responses().into_iter();
        if !succeeded {
            let token = match responses.next() {
                Some(TxnOpResponse::Get(mine)) => mine
                    .kvs()
                    .first()
                    .and_then(|kv| FencingToken::from_revision(kv.create_revision())),
                _ => None,
            };
            let token =
                token.ok_or_else(|| malformed("acquire", name, "existing key without revision"))?;
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

    /// The lock's keys up to mine (create revision at most my token), as `options` sorts
    /// and limits them: one read that answers where I stand.
    pub(super) async fn read_up_to(
        &self,
        token: FencingToken,
        options: GetOptions,
    ) -> Result<GetResponse, LockError> {
        let inner = self.inner();
        let options = options
            .with_prefix()
            .with_max_create_revision(token.as_revision());
        call_retrying(
            "wait",
            Some(&self.name),
            inner.config.request_timeout,
            || {
                let mut client = inner.kv.clone();
                let options = options.clone();
                async move { client.get(self.prefix.as_str(), Some(options)).await }
            },
        )
        .await
    }

    /// Joins a mutex's queue: the two newest keys are mine and the one right ahead.
    async fn enqueue(&self, key: &str) -> Result<(FencingToken, Place), LockError> {
        match self.join(key, newest_two()).await? {
            Joined::Now { token, read } => Ok((token, place_of(token, read.kvs()))),
            Joined::Earlier(token) => Ok((token, self.read_place(token).await?)),
        }
    }

    /// Waits until no key is ahead of mine, watching only the key right ahead (no herd).
    ///
    /// Each watch starts at the present and the queue is read after it is set up, so a
    /// deletion cannot slip between the read and the watch. One read answers both "is a
    /// key still ahead of me?" and "is my key still there?".
    async fn wait_turn(&self, token: FencingToken, ahead: Vec<u8>) -> Result<(), LockError> {
        let hub = &self.inner().hub;
        let mut watch = hub.watch_deletion(ahead);
        let mut backoff = Backoff::new();
        if !watch.created().await {
            backoff.wait().await;
        }
        loop {
            let place = match self.read_place(token).await {
                Ok(place) => place,
                // A leader election or a member going down: keep our place and retry. The
                // session's loss and the wait timeout bound how long.
                Err(err) if err.is_unavailable() => {
                    tracing::debug!(%err, "queue read failed; retrying");
                    backoff.wait().await;
                    continue;
                }
                Err(err) => return Err(err),
            };
            match place {
                Place::Head => return Ok(()),
                Place::Gone => return Err(self.lost_while_waiting()),
                Place::Behind(ahead) if watch.has_ended() || watch.key() != ahead.as_slice() => {
                    watch = hub.watch_deletion(ahead);
                    if watch.created().await {
                        backoff.reset();
                    } else {
                        backoff.wait().await;
                    }
                }
                Place::Behind(_) => watch.deleted().await,
            }
        }
    }

    /// Reads my place: the keys of the lock up to my create revision, newest first.
    async fn read_place(&self, token: FencingToken) -> Result<Place, LockError> {
        let read = self.read_up_to(token, newest_two()).await?;
        Ok(place_of(token, read.kvs()))
    }

    pub(super) fn lost_while_waiting(&self) -> LockError {
        LockError::LeaseLost {
            lock: Some(self.name.clone()),
            reason: self.inner().loss_reason().unwrap_or(LossReason::Revoked),
        }
    }

    /// Removes my key, then answers the caller; see the module docs for what happens
    /// when etcd does not confirm the removal within [`CLEANUP_ALLOWANCE`].
    async fn leave(
        &self,
        key: &str,
        slot: u64,
        reply: Reply,
        answer: Result<Option<EtcdGuard>, LockError>,
    ) {
        let removal = self.remove_until_confirmed(key, slot);
        tokio::pin!(removal);
        let removed = tokio::time::timeout(CLEANUP_ALLOWANCE, &mut removal)
            .await
            .is_ok();
        let _ = reply.send(answer);
        if !removed {
            tracing::warn!(key, "queue entry not removed yet; still trying");
            removal.await;
        }
    }

    /// Deletes my key, retrying until etcd confirms it or the session is gone: its lease
    /// then takes the key with it. The key's slot is free again once the delete is
    /// confirmed.
    async fn remove_until_confirmed(&self, key: &str, slot: u64) {
        let inner = self.inner();
        let mut backoff = Backoff::new();
        while inner.is_alive() {
            match delete_key(inner, &self.name, key).await {
                Ok(_) => return inner.slots.give_back(&self.prefix, slot),
                // Not allowed to delete it means not allowed to have written it either.
                Err(err) if err.is_permission_denied() => {
                    return inner.slots.give_back(&self.prefix, slot);
                }
                Err(err) => {
                    tracing::debug!(%err, key, "could not remove our queue entry; retrying");
                    backoff.wait().await;
                }
            }
        }
        tracing::debug!(key, "session gone: its lease removes our queue entry");
    }
}

/// Deletes exactly `key`; returns whether it was there.
///
/// A plain delete is as safe as one guarded by the create revision: a key name is used by
/// one acquisition at a time (its lease id and a slot), and reused only once its delete is
/// confirmed (`slots.rs`), so a late or retried delete can never remove a newer holder's
/// key. It is also the cheaper request (etcd applies a delete faster than a transaction).
pub(crate) async fn delete_key(
    inner: &SessionInner,
    name: &str,
    key: &str,
) -> Result<bool, LockError> {
    let response = call_retrying("release", Some(name), inner.config.request_timeout, || {
        let mut client = inner.kv.clone();
        async move { client.delete(key, None).await }
    })
    .await?;
    Ok(response.deleted() > 0)
}

/// What joining the queue found.
pub(super) enum Joined {
    /// My key was put now, and this is the read made in the same revision.
    Now {
        token: FencingToken,
        read: GetResponse,
    },
    /// An earlier attempt of the same request put it: my token, nothing read.
    Earlier(FencingToken),
}

/// The two newest keys (by create revision), names only.
fn newest_two() -> GetOptions {
    GetOptions::new()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
        .with_keys_only()
}

/// Reads my place from keys sorted by create revision, newest first, none newer than mine.
fn place_of(token: FencingToken, newest_first: &[etcd_client::KeyValue]) -> Place {
    let mine = newest_first
        .first()
        .is_some_and(|kv| FencingToken::from_revision(kv.create_revision()) == Some(token));
    match (mine, newest_first.get(1)) {
        (false, _) => Place::Gone,
        (true, None) => Place::Head,
        (true, Some(ahead)) => Place::Behind(ahead.key().to_vec()),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
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
