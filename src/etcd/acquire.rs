//! Taking an etcd lock: one transaction to join the queue, then FIFO waiting by watch.
//!
//! The join runs in the caller's future: an uncontended lock costs no task. Until the join
//! has an answer, a [`Cleanup`] guard is armed: if the caller's future is dropped then, it
//! removes the key (which may exist) in the background. A wait runs in a task of its own,
//! which the caller awaits: if the caller goes away meanwhile (its future dropped or timed
//! out) the task notices and removes its key; if a grant races with the drop, the guard
//! that nobody receives releases the lock as it is dropped.
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
    Compare, CompareOp, GetOptions, GetResponse, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use super::call::{call_retrying, malformed};
use super::guard::EtcdGuard;
use super::keys;
use super::kind::Kind;
use super::queue::{Ahead, Place};
use super::session::{Session, SessionInner};
use super::watch_hub::Subscription;
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
    let acquisition = Acquisition {
        prefix: keys::lock_prefix(&session.inner.config.namespace, name),
        name: name.to_owned(),
        session,
        owns_session,
        started,
        value: kind.value(),
        kind,
    };
    let slot = acquisition.inner().slots.take(&acquisition.prefix);
    let key = keys::waiter_key(&acquisition.prefix, acquisition.inner().lease_id(), slot);
    // If this session waited on this lock lately, its watch is still open and synced:
    // subscribed before joining, the join's own read is all a wait needs.
    let early = match mode {
        Mode::Wait { .. } => acquisition
            .inner()
            .hub
            .subscribe_if_open(&acquisition.prefix),
        Mode::Try => None,
    };
    let mut cleanup = Cleanup::armed(&acquisition, &key, slot);
    let joined = acquisition.enqueue(&key).await;
    let (token, place, revision) = match joined {
        Ok(joined) => joined,
        // Refused: nothing was written (and could not be deleted either).
        Err(err) if err.is_permission_denied() => {
            cleanup.disarm();
            acquisition
                .inner()
                .slots
                .give_back(&acquisition.prefix, slot);
            return Err(err);
        }
        Err(err) => {
            // No answer does not mean not applied, now or later: see the module docs. The
            // key holds our lease id, so it can only be ours.
            tracing::debug!(%err, key, "join failed; retiring the session");
            acquisition.inner().retire();
            return acquisition.leave(cleanup, Err(err)).await;
        }
    };
    match (place, mode) {
        (Place::Head, _) => {
            cleanup.disarm();
            Ok(Some(acquisition.grant(key, slot, token, false).await))
        }
        (Place::Gone, _) => {
            let lost = acquisition.lost_while_waiting();
            acquisition.leave(cleanup, Err(lost)).await
        }
        (Place::Behind(_), Mode::Try) => acquisition.leave(cleanup, Ok(None)).await,
        (Place::Behind(ahead), Mode::Wait { timeout }) => {
            // The waiting task owns the key from here on.
            cleanup.disarm();
            let (reply, answer) = oneshot::channel();
            let wait = Wait {
                key,
                slot,
                token,
                known: (ahead, revision),
                early,
                timeout,
            };
            let span = tracing::Span::current();
            tokio::spawn(acquisition.wait(wait, reply).instrument(span));
            answer.await.unwrap_or_else(|_| {
                Err(LockError::Backend {
                    backend: crate::Backend::Etcd,
                    operation: "acquire",
                    lock: Some(name.to_owned()),
                    source: "the acquisition task stopped (runtime shutting down?)".into(),
                })
            })
        }
    }
}

/// What a wait starts from.
struct Wait {
    key: String,
    slot: u64,
    token: FencingToken,
    /// The keys ahead, and the revision they were read at.
    known: (Ahead, i64),
    /// A subscription to the lock's watch taken before the join, if it was open: only
    /// then is the join's read a starting point.
    early: Option<Subscription>,
    timeout: Option<Duration>,
}

/// Removes a queue key whose acquisition was dropped before it could: armed while the
/// key may exist with nobody else to remove it.
pub(super) struct Cleanup {
    removal: Option<Removal>,
}

/// Everything removing one key takes.
#[derive(Clone)]
struct Removal {
    session: Session,
    name: String,
    prefix: String,
    key: String,
    slot: u64,
}

impl Cleanup {
    fn armed(acquisition: &Acquisition, key: &str, slot: u64) -> Self {
        Self {
            removal: Some(acquisition.removal(key, slot)),
        }
    }

    fn disarm(&mut self) {
        self.removal = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(removal) = self.removal.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(removal.run());
        }
    }
}

impl Removal {
    /// Deletes the key, retrying until etcd confirms it or the session is gone: its lease
    /// then takes the key with it. The key's slot is free again once the delete is
    /// confirmed.
    async fn run(self) {
        let inner = &self.session.inner;
        let mut backoff = Backoff::new();
        while inner.is_alive() {
            match delete_key(inner, &self.name, &self.key).await {
                Ok(_) => return inner.slots.give_back(&self.prefix, self.slot),
                // Not allowed to delete it means not allowed to have written it either.
                Err(err) if err.is_permission_denied() => {
                    return inner.slots.give_back(&self.prefix, self.slot);
                }
                Err(err) => {
                    tracing::debug!(%err, key = self.key, "could not remove our queue entry; retrying");
                    backoff.wait().await;
                }
            }
        }
        tracing::debug!(
            key = self.key,
            "session gone: its lease removes our queue entry"
        );
    }
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

impl Acquisition {
    pub(super) fn inner(&self) -> &SessionInner {
        &self.session.inner
    }

    /// What removing `key` takes.
    fn removal(&self, key: &str, slot: u64) -> Removal {
        Removal {
            session: self.session.clone(),
            name: self.name.clone(),
            prefix: self.prefix.clone(),
            key: key.to_owned(),
            slot,
        }
    }

    /// The guard for a grant; `waited` says whether it queued first (a lock without
    /// renewal then renews once more, so that its TTL counts from now).
    async fn grant(self, key: String, slot: u64, token: FencingToken, waited: bool) -> EtcdGuard {
        tracing::debug!(%token, waited, "lock acquired");
        if self.owns_session {
            self.inner().stop_renewing(waited).await;
        }
        EtcdGuard::new(self.session, self.owns_session, self.name, key, slot, token)
    }

    /// Waits in line (in its own task), then answers through `reply`.
    async fn wait(self, wait: Wait, mut reply: Reply) {
        let Wait {
            key,
            slot,
            token,
            known,
            early,
            timeout,
        } = wait;
        let deadline = timeout.map(|t| self.started + t);
        // The join's read is a starting point only if the subscription was in place before
        // it: a subscription made now may miss deletions dispatched in between, so the
        // wait reads again once it is in place.
        let (watch, known) = match early {
            Some(watch) => (watch, Some(known)),
            None => (self.inner().hub.subscribe(&self.prefix), None),
        };
        let waiting = self.wait_in_line(token, &key, known, watch);
        let outcome = tokio::select! {
            waited = waiting => waited,
            _ = self.session.inner.lost() => Err(self.lost_while_waiting()),
            _ = sleep_until_opt(deadline) => Err(LockError::WaitTimeout {
                name: self.name.clone(),
                waited: timeout.unwrap_or_default(),
            }),
            _ = reply.closed() => {
                tracing::debug!("caller gave up waiting; leaving the queue");
                return self.removal(&key, slot).run().await;
            }
        };
        match outcome {
            Ok(()) => {
                let guard = self.grant(key, slot, token, true).await;
                // If the caller is gone, the guard comes back and its drop releases.
                let _ = reply.send(Ok(Some(guard)));
            }
            Err(err) => {
                let cleanup = Cleanup::armed(&self, &key, slot);
                let answer = self.leave(cleanup, Err(err)).await;
                let _ = reply.send(answer);
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

    /// The lock's keys up to mine (create revision at most my token), as `options` asks:
    /// one read that answers where I stand.
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

    pub(super) fn lost_while_waiting(&self) -> LockError {
        LockError::LeaseLost {
            lock: Some(self.name.clone()),
            reason: self.inner().loss_reason().unwrap_or(LossReason::Revoked),
        }
    }

    /// Removes my key (the one `cleanup` is armed for), then returns `answer`; see the
    /// module docs for what happens when etcd does not confirm the removal within
    /// [`CLEANUP_ALLOWANCE`]. If this future is dropped meanwhile, `cleanup` goes on in the
    /// background.
    async fn leave(
        &self,
        mut cleanup: Cleanup,
        answer: Result<Option<EtcdGuard>, LockError>,
    ) -> Result<Option<EtcdGuard>, LockError> {
        let Some(removal) = cleanup.removal.as_ref() else {
            return answer;
        };
        if tokio::time::timeout(CLEANUP_ALLOWANCE, removal.clone().run())
            .await
            .is_ok()
        {
            cleanup.disarm();
        } else {
            tracing::warn!(
                key = removal.key,
                "queue entry not removed yet; still trying"
            );
            // Dropping the armed cleanup goes on removing it in the background.
        }
        answer
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

/// The store revision a read was made at.
pub(super) fn revision_of(read: &GetResponse) -> i64 {
    read.header().map_or(0, |h| h.revision())
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
