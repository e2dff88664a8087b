//! Taking an etcd lock: one transaction to join the queue, then FIFO waiting by watch.
//!
//! Every acquisition runs in a task of its own, and the caller awaits its answer. If the
//! caller goes away (its future dropped or timed out) the task notices and removes its key,
//! so no orphan key is ever left in the queue; if a grant races with the drop, the guard
//! that nobody receives releases the lock as it is dropped.

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
use super::session::{Session, SessionInner};
use crate::{FencingToken, LockError, LossReason};

/// Whether to wait for the lock, and until when.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// Return at once if someone is ahead of us.
    Try,
    /// Wait in line; `timeout` bounds the whole acquisition.
    Wait { timeout: Option<Duration> },
}

/// How a key waits in its queue, and what it holds.
#[derive(Clone, Debug)]
pub(crate) struct Queue {
    /// How many holders at once: 1 for a mutex, N for a semaphore.
    pub(crate) permits: usize,
    /// A reader of a read-write lock: admitted when no *writer* is ahead.
    pub(crate) shared: bool,
    /// What the key holds (an election candidate's value, a read-write lock's side).
    pub(crate) value: Vec<u8>,
}

impl Queue {
    /// One holder at a time.
    pub(crate) fn exclusive() -> Self {
        Self {
            permits: 1,
            shared: false,
            value: Vec::new(),
        }
    }
}

/// Runs one acquisition in its own task and returns its outcome.
///
/// `owns_session`: the session was opened for this lock alone (no renewal) and ends with it.
/// `queue`: the discipline (mutex, semaphore in `permits.rs`, reader in `shared.rs`).
pub(crate) async fn acquire(
    session: Session,
    owns_session: bool,
    name: &str,
    mode: Mode,
    queue: Queue,
) -> Result<Option<EtcdGuard>, LockError> {
    let (reply, answer) = oneshot::channel();
    let span = tracing::Span::current();
    let task = Acquisition {
        prefix: keys::lock_prefix(&session.inner.config.namespace, name),
        name: name.to_owned(),
        session,
        owns_session,
        started: Instant::now(),
        permits: queue.permits,
        shared: queue.shared,
        value: queue.value,
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
    pub(super) permits: usize,
    pub(super) shared: bool,
    /// What the key holds (an election candidate's value; empty for locks).
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
        let key = keys::waiter_key(
            &self.prefix,
            self.inner().lease_id(),
            self.inner().next_sequence(),
        );
        let joined = if self.shared {
            self.enqueue_shared(&key).await
        } else if self.permits > 1 {
            self.enqueue_for_permit(&key).await
        } else {
            self.enqueue(&key).await
        };
        let (token, place) = match joined {
            Ok(joined) => joined,
            Err(err) => {
                // No answer does not mean not applied: remove the key in case the put went
                // through. It holds our lease id, so it can only be ours.
                self.remove_unconditionally(&key).await;
                let _ = reply.send(Err(err));
                return;
            }
        };
        let outcome = match (place, mode) {
            (Place::Head, _) => Some(Ok(true)),
            (Place::Gone, _) => Some(Err(self.lost_while_waiting())),
            (Place::Behind(_), Mode::Try) => Some(Ok(false)),
            (Place::Behind(ahead), Mode::Wait { timeout }) => {
                let deadline = timeout.map(|t| self.started + t);
                let waiting = async {
                    if self.shared {
                        self.wait_shared(token).await
                    } else if self.permits > 1 {
                        self.wait_for_permit(token, &key).await
                    } else {
                        self.wait_turn(token, ahead).await
                    }
                };
                tokio::select! {
                    waited = waiting => Some(waited.map(|()| true)),
                    _ = self.session.inner.lost() => Some(Err(self.lost_while_waiting())),
                    _ = sleep_until_opt(deadline) => Some(Err(LockError::WaitTimeout {
                        name: self.name.clone(),
                        waited: timeout.unwrap_or_default(),
                    })),
                    _ = reply.closed() => None,
                }
            }
        };
        match outcome {
            Some(Ok(true)) => {
                tracing::debug!(%token, "lock acquired");
                let guard = EtcdGuard::new(self.session, self.owns_session, self.name, key, token);
                // If the caller is gone, the guard comes back and its drop releases.
                let _ = reply.send(Ok(Some(guard)));
            }
            Some(Ok(false)) => {
                self.remove_if_mine(&key, token).await;
                let _ = reply.send(Ok(None));
            }
            Some(Err(err)) => {
                self.remove_if_mine(&key, token).await;
                let _ = reply.send(Err(err));
            }
            None => {
                tracing::debug!("caller gave up waiting; leaving the queue");
                self.remove_if_mine(&key, token).await;
            }
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

    async fn remove_if_mine(&self, key: &str, token: FencingToken) {
        if let Err(err) = delete_if_owner(self.inner(), &self.name, key, token).await {
            tracing::warn!(%err, key, "could not remove our queue entry; the lease will");
        }
    }

    async fn remove_unconditionally(&self, key: &str) {
        let inner = self.inner();
        let timeout = inner.config.request_timeout;
        let delete = call_retrying("acquire cleanup", Some(&self.name), timeout, || {
            let mut client = inner.kv.clone();
            async move { client.delete(key, None).await }
        });
        if let Err(err) = delete.await {
            tracing::warn!(%err, key, "could not remove a possibly written key; the lease will");
        }
    }
}

/// Deletes `key` only while its create revision is `token`: a retried or late release can
/// never remove a newer holder's key. Returns whether it deleted.
pub(crate) async fn delete_if_owner(
    inner: &SessionInner,
    name: &str,
    key: &str,
    token: FencingToken,
) -> Result<bool, LockError> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            key,
            CompareOp::Equal,
            token.as_revision(),
        )])
        .and_then([TxnOp::delete(key, None)]);
    let response = call_retrying("release", Some(name), inner.config.request_timeout, || {
        let mut client = inner.kv.clone();
        let txn = txn.clone();
        async move { client.txn(txn).await }
    })
    .await?;
    Ok(response.succeeded())
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
