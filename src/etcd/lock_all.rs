//! Several etcd locks taken together: **one transaction** puts a key in every lock's
//! queue, then each key waits in its own queue as a single lock's does, and the
//! acquisition holds once every key is at the head of its queue.
//!
//! # One revision for every key
//!
//! An etcd transaction is applied atomically at one revision: every put in it is given
//! that revision as its key's create revision (`mvcc/kvstore_txn.go`: `storeTxnWrite.put`
//! stamps `CreateRevision` with `beginRev + 1` for every key it creates, the sub-revision
//! only orders changes inside the transaction). So every key of one acquisition carries
//! the same create revision: the token of every name, larger than every earlier grant's
//! of each name (each queue is ordered by create revision, as for a single lock). Reads
//! in the same transaction see its puts (`storeTxnWrite.Range` reads at `beginRev + 1`
//! once the transaction has changes): each name's read returns its new key and every key
//! ahead of it, the same starting point a single join has.
//!
//! # Why no two acquisitions deadlock
//!
//! A waiting key waits only for keys of *lower* create revision in its own queue (keys
//! ahead only leave; newcomers queue behind). Every key of one acquisition has the same
//! revision `r`, so an acquisition at `r` waits only for acquisitions at revisions below
//! `r`: "waits for" always points to lower revisions, and cannot close a cycle. Within
//! each name the order is still FIFO. A single-name lock (fencelock's, Go's
//! `concurrency.Mutex`, `etcdctl lock`) holds one key and waits for nothing while it
//! holds, so mixing them on the same names is safe.
//!
//! What is **not** safe: mixing this with locks taken one by one (the generic
//! [`lock_all`](crate::lock_all) of other backends, or nested single locks: one held
//! while the next waits, even in name order) on the same etcd names. An
//! ordered taker holding `a` (key at `r_a`) and queued for `b` (key at `r_b`, taken later)
//! and a one-transaction waiter at `r` with `r_a < r < r_b` wait for each other: the
//! ordered one for the waiter's key in `b`, the waiter for the ordered one's key in `a`.
//! That is why every `lock_all` on etcd is this one ([`crate::LockBackend::lock_all`]).
//!
//! # The rules of `key_life.rs`, for every key
//!
//! Each key is a [`QueueKey`] (a slot of the session). The join is sent alone (not through
//! the group commit: `batch.rs` carries one key per member). An attempt without an answer
//! marks every key's join unknown (each name spent, the session retired, and each key
//! swept once removed). A retry that finds the keys already put (an unanswered attempt
//! landed) adopts none of them: the acquisition fails with a retryable error once they
//! are removed. Until the join is answered, a [`Cleanup`] per key removes it if the
//! call is dropped; after that, a key waits in a task of its own (as `acquire.rs`'s)
//! that removes it when the call goes away. Once held, the locks are released together:
//! one transaction deletes every key (`release_all.rs`), under the same rules.

use std::future::Future;
use std::task::Poll;

use etcd_client::TxnOpResponse;
use etcd_client::{Compare, CompareOp, GetOptions, GetResponse, PutOptions, Txn, TxnOp};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::acquire::{Acquisition, CLEANUP_ALLOWANCE, Mode, Wait, internal};
use super::call::{Attempts, call_retrying_noting, malformed};
use super::guard::EtcdGuard;
use super::key_life::{Cleanup, QueueKey};
use super::kind::Kind;
use super::queue::Place;
use super::session::Session;
use super::watch_hub::{Subscription, TrackedKey};
use crate::{Backend, FencingToken, LockError, LockGuard, LossReason};

/// The most locks one etcd `lock_all` takes: its transaction has a put and a read per
/// lock, and etcd refuses a transaction of more than `--max-txn-ops` operations (128 by
/// default) in one branch.
pub const MAX_LOCK_ALL: usize = 64;

/// The most bytes of keys and values one join carries: as a group commit's batch
/// (`batch.rs`), well inside etcd's default `--max-request-bytes` (1.5 MiB). (Its answer
/// is read up to `answers.rs`'s limit, 64 MiB.)
const MAX_JOIN_BYTES: usize = 512 * 1024;

/// One lock of the acquisition: its key (armed to be removed), and its place on the
/// lock's watch, taken before the join.
struct Member {
    cleanup: Cleanup,
    early: Option<Subscription>,
    tracked: Option<TrackedKey>,
}

/// A waiting key's task, and where it answers.
struct Waiting {
    index: usize,
    answer: oneshot::Receiver<Result<Option<EtcdGuard>, LockError>>,
    task: JoinHandle<()>,
}

/// Takes every lock of `names` (sorted, distinct, checked) on `session` together, each key
/// holding `value`; `None` in [`Mode::Try`] if some key is not at the head of its queue.
/// `owns_session`: the session serves this acquisition alone and stops renewing once
/// every lock is held. The guards come back in name order.
pub(crate) async fn acquire_all(
    session: Session,
    owns_session: bool,
    names: &[String],
    mode: Mode,
    value: Vec<u8>,
    started: Instant,
) -> Result<Option<Vec<EtcdGuard>>, LockError> {
    let hub = session.inner.hub.clone();
    let label = names.join(",");
    let mut members = Vec::with_capacity(names.len());
    let mut bytes = 0;
    for name in names {
        let key = QueueKey::take(session.clone(), name, value.clone());
        // As `acquire.rs`: a watch open before the join makes the join's read enough.
        let early = match mode {
            Mode::Wait { .. } if hub.is_open(key.prefix()) => Some(hub.subscribe(key.prefix())),
            _ => None,
        };
        let tracked = hub.track(key.prefix(), &key.key);
        bytes += key.key.len() * 2 + key.prefix().len() + value.len() + 64;
        members.push(Member {
            cleanup: Cleanup::joining(key),
            early,
            tracked,
        });
    }
    if bytes > MAX_JOIN_BYTES {
        give_back(members);
        return Err(LockError::InvalidOption {
            option: "names",
            reason: format!(
                "{} locks make a join of {bytes} bytes, more than {MAX_JOIN_BYTES}: take fewer \
                 together",
                names.len()
            ),
        });
    }
    let (token, reads) = match join(&session, &mut members, &label).await {
        Ok(joined) => joined,
        Err(err) => {
            if members
                .iter()
                .any(|m| m.cleanup.key().is_some_and(QueueKey::join_unknown))
            {
                // No answer does not mean not applied: see `key_life.rs`.
                leave_all(members).await;
            } else {
                // Refused: nothing was written.
                give_back(members);
            }
            return Err(err);
        }
    };
    let acquisition = || Acquisition::new(hub.clone(), false, started, Kind::Mutex);
    let mut places = Vec::with_capacity(members.len());
    for (member, read) in members.iter().zip(&reads) {
        let gone = member
            .tracked
            .as_ref()
            .is_some_and(|t| t.settle(token.as_revision()));
        let place = acquisition().place(token, read.kvs());
        places.push(if gone { Place::Gone } else { place });
    }
    if let Some(gone) = places.iter().position(|p| *p == Place::Gone) {
        let lost = match members[gone].cleanup.key() {
            Some(key) => acquisition().key_gone_checked(key, None).await,
            None => acquisition().key_gone(None),
        };
        leave_all(members).await;
        return Err(lost);
    }
    let busy = places.iter().any(|p| matches!(p, Place::Behind(_)));
    let timeout = match mode {
        Mode::Try if busy => {
            leave_all(members).await;
            return Ok(None);
        }
        Mode::Try => None,
        Mode::Wait { timeout } => timeout,
    };
    let (mut guards, mut waits) = start_each(members, places, token, timeout, &acquisition).await?;
    let waited = !waits.is_empty();
    if let Err(err) = gather(&mut guards, &mut waits, &label).await {
        abandon(guards, waits).await;
        return Err(err);
    }
    let guards: Vec<EtcdGuard> = guards.into_iter().flatten().collect();
    if let Some(lost) = guards.iter().find(|g| !g.is_held()) {
        let err = LockError::LeaseLost {
            lock: Some(lost.name().to_owned()),
            reason: session
                .inner
                .loss_reason()
                .unwrap_or(LossReason::KeyDeleted),
        };
        abandon(guards.into_iter().map(Some).collect(), Vec::new()).await;
        return Err(err);
    }
    if guards.len() != names.len() {
        return Err(internal(&label, "a lock's answer went missing"));
    }
    if owns_session {
        // The lease served these locks alone: their TTL counts from now.
        session.inner.stop_renewing(waited).await;
    }
    tracing::debug!(%token, waited, locks = guards.len(), "locks acquired together");
    Ok(Some(guards))
}

/// Each key now as a single lock's: granted at once at the head of its queue, else
/// waiting in a task of its own (`acquire.rs`'s), with the place the join read and the
/// watch subscribed before it. Returns the guards granted (by index) and the waits; on
/// an error, what was started is abandoned.
async fn start_each(
    members: Vec<Member>,
    places: Vec<Place>,
    token: FencingToken,
    timeout: Option<std::time::Duration>,
    acquisition: &(dyn Fn() -> Acquisition + Sync),
) -> Result<(Vec<Option<EtcdGuard>>, Vec<Waiting>), LockError> {
    let mut guards: Vec<Option<EtcdGuard>> = (0..members.len()).map(|_| None).collect();
    let mut waits = Vec::new();
    for (index, (member, place)) in members.into_iter().zip(places).enumerate() {
        let Member {
            mut cleanup,
            early,
            tracked,
        } = member;
        let Some(key) = cleanup.disarm() else {
            return Err(internal("lock_all", "a queue key went missing"));
        };
        match place {
            Place::Behind(ahead) => {
                let (reply, answer) = oneshot::channel();
                let wait = Wait {
                    token,
                    known: (ahead, token.as_revision()),
                    early,
                    tracked,
                    timeout,
                };
                let span = tracing::Span::current();
                let task = tokio::spawn(acquisition().wait(key, wait, reply).instrument(span));
                waits.push(Waiting {
                    index,
                    answer,
                    task,
                });
            }
            _ => {
                let granted = acquisition()
                    .grant(key, tracked, token, token.as_revision(), false)
                    .await;
                match granted {
                    Ok(guard) => guards[index] = Some(guard),
                    Err(err) => {
                        abandon(guards, waits).await;
                        return Err(err);
                    }
                }
            }
        }
    }
    Ok((guards, waits))
}

/// Sends the join of every member's key in one transaction: each key put under the
/// session's lease if it does not exist yet, each lock's prefix read after the puts.
/// Returns the shared token and each lock's read.
async fn join(
    session: &Session,
    members: &mut [Member],
    label: &str,
) -> Result<(FencingToken, Vec<GetResponse>), LockError> {
    let inner = &session.inner;
    let lease = inner.lease_id();
    let read = GetOptions::new().with_keys_only().with_prefix();
    let build = || {
        let mut compares = Vec::with_capacity(members.len());
        let mut ops = Vec::with_capacity(members.len() * 2);
        let mut reads = Vec::with_capacity(members.len());
        for key in members.iter().filter_map(|m| m.cleanup.key()) {
            compares.push(Compare::create_revision(&*key.key, CompareOp::Equal, 0));
            let put = PutOptions::new().with_lease(lease);
            ops.push(TxnOp::put(&*key.key, key.value().to_vec(), Some(put)));
            reads.push(TxnOp::get(&**key.prefix(), Some(read.clone())));
        }
        ops.extend(reads);
        // No failure branch: a key already there is never adopted (module docs).
        Txn::new().when(compares).and_then(ops)
    };
    // Built again for a retry rather than cloned for every attempt.
    let mut first = Some(build());
    let Attempts { result, ambiguous } = call_retrying_noting(
        "acquire",
        Some(label),
        inner.config.request_timeout,
        &inner.renewal,
        || {
            let mut kv = inner.kv.clone();
            let txn = first.take().unwrap_or_else(build);
            async move { kv.txn(txn).await }
        },
    )
    .await;
    if ambiguous {
        each_key(members, QueueKey::mark_join_unknown);
    }
    let answer = result?;
    for member in members.iter_mut() {
        member.cleanup.created();
    }
    let joined = read_answer(answer, members.len(), label);
    match &joined {
        Ok(_) => each_key(members, QueueKey::forget_value),
        // Applied, but not as these keys: whatever is there is removed, no name reused.
        Err(_) => each_key(members, QueueKey::mark_join_unknown),
    }
    joined
}

/// Runs `what` on every member's key.
fn each_key(members: &mut [Member], what: fn(&mut QueueKey)) {
    members
        .iter_mut()
        .filter_map(|m| m.cleanup.key_mut())
        .for_each(what);
}

/// The token and each lock's read from the join's answer.
fn read_answer(
    answer: etcd_client::TxnResponse,
    locks: usize,
    label: &str,
) -> Result<(FencingToken, Vec<GetResponse>), LockError> {
    if !answer.succeeded() {
        return Err(LockError::Unavailable {
            backend: Backend::Etcd,
            operation: "acquire",
            lock: Some(label.to_owned()),
            source: "an earlier attempt of the join without an answer put its keys; they are \
                     removed and the session retired: try again"
                .into(),
        });
    }
    let token = answer
        .header()
        .and_then(|h| FencingToken::from_revision(h.revision()))
        .ok_or_else(|| malformed("acquire", Some(label), "missing header revision"))?;
    let reads: Vec<GetResponse> = answer
        .op_responses()
        .into_iter()
        .skip(locks)
        .filter_map(|response| match response {
            TxnOpResponse::Get(read) => Some(read),
            _ => None,
        })
        .collect();
    if reads.len() != locks {
        return Err(malformed(
            "acquire",
            Some(label),
            "a lock's range result missing",
        ));
    }
    Ok((token, reads))
}

/// Waits for every waiting key's answer, the locks granted so far watched meanwhile: the
/// first error (or loss of a granted lock) ends it.
async fn gather(
    guards: &mut [Option<EtcdGuard>],
    waits: &mut Vec<Waiting>,
    label: &str,
) -> Result<(), LockError> {
    while !waits.is_empty() {
        let answered = tokio::select! {
            answered = next_answer(waits) => answered,
            (name, reason) = any_lost(guards) => {
                return Err(LockError::LeaseLost { lock: Some(name), reason });
            }
        };
        let (position, answer) = answered;
        let index = waits[position].index;
        match answer {
            Ok(Ok(Some(guard))) => {
                waits.swap_remove(position);
                guards[index] = Some(guard);
            }
            Ok(Ok(None)) => {
                waits.swap_remove(position);
                return Err(internal(label, "a waiting key returned without its lock"));
            }
            Ok(Err(err)) => {
                waits.swap_remove(position);
                return Err(err);
            }
            Err(_) => {
                waits.swap_remove(position);
                return Err(internal(
                    "lock_all",
                    "a waiting task stopped (runtime shutting down?)",
                ));
            }
        }
    }
    Ok(())
}

/// The first answer of `waits`, and its position.
async fn next_answer(
    waits: &mut [Waiting],
) -> (
    usize,
    Result<Result<Option<EtcdGuard>, LockError>, oneshot::error::RecvError>,
) {
    std::future::poll_fn(|cx| {
        for (position, waiting) in waits.iter_mut().enumerate() {
            if let Poll::Ready(answer) = std::pin::Pin::new(&mut waiting.answer).poll(cx) {
                return Poll::Ready((position, answer));
            }
        }
        Poll::Pending
    })
    .await
}

/// Resolves when any granted lock may be lost (never if none is granted).
async fn any_lost(guards: &[Option<EtcdGuard>]) -> (String, LossReason) {
    let mut watching: Vec<_> = guards
        .iter()
        .flatten()
        .map(|guard| Box::pin(async move { (guard.name().to_owned(), guard.lost().await) }))
        .collect();
    std::future::poll_fn(|cx| {
        for loss in &mut watching {
            if let Poll::Ready(found) = loss.as_mut().poll(cx) {
                return Poll::Ready(found);
            }
        }
        Poll::Pending
    })
    .await
}

/// Gives up the acquisition: the waiting tasks are told (each removes its key), the
/// granted locks released; answered once that is done, or after [`CLEANUP_ALLOWANCE`]
/// (the rest goes on in the background).
async fn abandon(guards: Vec<Option<EtcdGuard>>, waits: Vec<Waiting>) {
    let tasks: Vec<JoinHandle<()>> = waits
        .into_iter()
        .map(|waiting| {
            drop(waiting.answer);
            waiting.task
        })
        .collect();
    let granted: Vec<EtcdGuard> = guards.into_iter().flatten().collect();
    let finished = async {
        let _ = crate::multi::release_all(granted).await;
        for task in tasks {
            let _ = task.await;
        }
    };
    let _ = tokio::time::timeout(CLEANUP_ALLOWANCE, finished).await;
}

/// Removes every member's key (all at once), answering within [`CLEANUP_ALLOWANCE`]; what
/// etcd has not confirmed by then goes on in the background.
async fn leave_all(members: Vec<Member>) {
    let mut leaving = tokio::task::JoinSet::new();
    for member in members {
        leaving.spawn(member.cleanup.leave(CLEANUP_ALLOWANCE));
    }
    while leaving.join_next().await.is_some() {}
}

/// Gives every member's name back: nothing was sent, or the join was refused.
fn give_back(members: Vec<Member>) {
    for mut member in members {
        if let Some(key) = member.cleanup.disarm() {
            key.give_back();
        }
    }
}
