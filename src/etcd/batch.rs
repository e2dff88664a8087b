//! Group commit: the joins and releases of one session that queue up while one of its
//! requests is in flight go out together, as one etcd transaction.
//!
//! No timer: a request that finds fewer than `max_in_flight` (default 4) of its session's
//! requests or batches in flight is sent at once, alone and exactly as it would be without
//! batching (so an uncontended cycle, or a few tasks, cost what they did); only requests
//! that arrive while that many are in flight wait, and all that waited go out in the next
//! transaction when one returns (natural batching, like a database's group commit).
//!
//! A batch is one flat transaction: `if create_revision(k) == 0` for every joining key `k`,
//! then put each `k` and read its lock's prefix, and delete each releasing key; else read
//! each joining key, and delete each releasing key. What each member keeps, and the server
//! guarantees it rests on:
//!
//! - **Its token.** Every write of a transaction is applied at one main revision
//!   (`apply.go` `applyTxn` under one `TxnWrite`), so a member that put its key has the
//!   batch's header revision as create revision: strictly greater than any earlier
//!   revision, never handed out again. Two *different* locks taken in one batch share it;
//!   two requests about the **same** lock are never in one batch, so per lock tokens still
//!   strictly increase and never repeat, and a lock's prefix read sees no other key of the
//!   same batch.
//! - **Its own outcome.** The compares fail only when some joining key exists already,
//!   which happens only when an earlier attempt of this very batch (retried after no
//!   answer) or of that member's request got through. Then nothing is put: members whose
//!   key is there are answered from it (as a lone retried join is), and members whose key
//!   is not are sent again alone, so one member's key decides nothing for another.
//!   Releases are in both branches: they are applied whatever the compares say.
//! - **Atomic fate.** A transaction is one Raft proposal, applied whole or not at all
//!   (`v3_server.go` `Txn`: one `InternalRaftRequest`). So a batch whose answer is lost is
//!   ambiguous for every member, exactly as a lone request would be: each member's caller
//!   applies the rules of `key_life.rs` (a join without an answer retires its session, a
//!   release without one spends its name).
//! - **No member refused for another.** A request etcd refuses before Raft or that Raft
//!   refuses alike on every member (a permission one lock lacks, too many operations for
//!   the server's `--max-txn-ops`, too large) is refused whole without applying anything
//!   (`v3rpc/key.go` `checkTxnRequest`, `apply_auth.go` `checkTxnAuth`); the members are
//!   then sent again each alone, so each gets its own answer. A refusal for too many
//!   operations also lowers the batch limit.
//! - **No nested transactions.** etcd 3.4 and 3.5 up to their 2026 security releases do
//!   not check permissions of operations nested in a transaction's transactions (etcd PRs
//!   #21677, #21689: "RBAC authorization bypass issue for put requests nested in TXNs"):
//!   a batch of nested transactions would let a least-privilege user write where it may
//!   not, and would hide a refusal a member must hear of. Flat operations are checked.
//! - **Withdrawal before sending.** A member whose caller went away before its batch was
//!   formed is left out: it was never sent (its caller's cleanup still assumes the worst,
//!   which is safe).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::{KvClient, Txn, TxnOpResponse};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Duration;
use tracing::Instrument;

use super::call::{Attempts, call_retrying_noting, may_have_applied};
use super::request::{Answer, Request, Sent};
use super::request::{copy_error, malformed_member};
use super::token_renewal::TokenRenewal;
use crate::{Backend, LockError};

/// How many requests or batches of one session may be in flight at once before the next
/// ones queue, by default. Four, not one: with one, 8 tasks of one process ran at 0.82x
/// etcd's Lock RPC (fsync on, each request waiting out the one before it); with two at
/// 0.90x; with four at 1.01x, while 64 tasks still ran at 2.1x (they batch behind the
/// four). Measured with `fencelock bench --fsync` on 2 cores.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// The largest batch by default: etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_BATCH: usize = 128;

/// Batches of two or more members sent by this process, and their members: the fault soak
/// reports them, so that a run that batched nothing cannot pass for one that covered
/// batches.
static BATCHES: AtomicU64 = AtomicU64::new(0);
static BATCHED: AtomicU64 = AtomicU64::new(0);

/// (batches of two or more sent by this process so far, requests they carried).
#[cfg(feature = "testkit")]
pub(crate) fn batched_so_far() -> (u64, u64) {
    (
        BATCHES.load(Ordering::Relaxed),
        BATCHED.load(Ordering::Relaxed),
    )
}

/// Where one request stands, shared by its caller and the batcher: whoever moves it out
/// of `QUEUED` first decides whether it is sent (the batcher, or the caller itself after
/// [`PATIENCE`]) or withdrawn (its caller went away first).
#[derive(Debug, Default)]
pub(super) struct Ticket(AtomicU8);

const QUEUED: u8 = 0;
const SENT: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Ticket {
    /// Claims the request for sending; false if it was withdrawn or claimed already.
    fn claim(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, SENT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Withdraws the request if it was not sent yet: true means nothing of it ever
    /// reached the network, so it cannot land later.
    pub(super) fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// How long a request waits in the queue before it goes out alone: a batch round trip
/// takes milliseconds; one this slow is stuck on a stalled member or a lost answer, and a
/// request behind it must not share its fate (nor wait its request timeout).
const PATIENCE: Duration = Duration::from_millis(250);

/// The most bytes of keys and values one batch carries: well inside etcd's default
/// `--max-request-bytes` (1.5 MiB) and gRPC's 4 MiB, so that large values (election
/// candidates) cannot make a batch the server refuses while each member alone fits.
const MAX_BATCH_BYTES: usize = 512 * 1024;

/// A request waiting for a request or batch in flight to return.
struct Queued {
    request: Request,
    ticket: Arc<Ticket>,
    reply: oneshot::Sender<Sent>,
    /// When its caller queued it: an error copied from the batch states the member's own
    /// time spent, not the batch's.
    since: tokio::time::Instant,
}

#[derive(Default)]
struct State {
    /// Requests or batches of this session in flight (at most the batcher's limit).
    in_flight: usize,
    queue: VecDeque<Queued>,
}

/// One session's group commit; see the module docs.
pub(crate) struct Batcher {
    kv: KvClient,
    renewal: TokenRenewal,
    timeout: Duration,
    /// The most operations one batch may have (1: no batching).
    limit: AtomicUsize,
    /// Requests or batches in flight at once before the next ones queue.
    in_flight_limit: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher sending on `kv`, each request or batch bounded by `timeout`, batches of
    /// at most `limit` operations, at most `in_flight` requests or batches in flight.
    pub(crate) fn new(
        kv: KvClient,
        renewal: TokenRenewal,
        timeout: Duration,
        limit: usize,
        in_flight: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            kv,
            renewal,
            timeout,
            limit: AtomicUsize::new(limit.max(1)),
            in_flight_limit: in_flight.max(1),
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is a queue and a count, consistent after every statement: a panic
        // elsewhere while it was locked leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends `request`: at once and alone if fewer than the limit of this session's
    /// requests are in flight, else in the next batch, or alone after [`PATIENCE`] if no batch took it by then. `ticket`
    /// tells the caller, if this future is dropped, whether the request was ever sent
    /// ([`Ticket::withdraw`]).
    ///
    /// # Cancel safety
    /// Dropping the future before the request was sent withdraws it (see `ticket`).
    /// Dropped after, the request may still be applied, as any request whose answer nobody
    /// waited for: the caller must treat it as sent without an answer.
    pub(super) async fn send(self: &Arc<Self>, request: Request, ticket: Arc<Ticket>) -> Sent {
        match self.route(request, &ticket) {
            Route::Alone(request) => {
                request
                    .send_alone(&self.kv, &self.renewal, self.timeout)
                    .await
            }
            Route::Lead(request) => {
                // Whatever becomes of this future, what queues behind it goes out.
                let turn = Turn(Some(self.clone()));
                let sent = request
                    .send_alone(&self.kv, &self.renewal, self.timeout)
                    .await;
                drop(turn);
                sent
            }
            Route::Queued {
                mut answer,
                operation,
                lock,
            } => {
                let stopped = |_| Attempts {
                    result: Err(LockError::Backend {
                        backend: Backend::Etcd,
                        operation,
                        lock: Some(lock.clone()),
                        source: "the batch task stopped (runtime shutting down?)".into(),
                    }),
                    ambiguous: true,
                };
                if let Ok(answer) = tokio::time::timeout(PATIENCE, &mut answer).await {
                    return answer.unwrap_or_else(stopped);
                }
                match self.reclaim(&ticket) {
                    Some(request) => {
                        tracing::debug!("queued past patience; sending alone");
                        request
                            .send_alone(&self.kv, &self.renewal, self.timeout)
                            .await
                    }
                    // A batch took it meanwhile.
                    None => answer.await.unwrap_or_else(stopped),
                }
            }
        }
    }

    /// Decides how `request` goes out, queueing it if the limit is in flight.
    fn route(&self, request: Request, ticket: &Arc<Ticket>) -> Route {
        if self.limit.load(Ordering::Relaxed) <= 1 {
            ticket.claim();
            return Route::Alone(request);
        }
        let mut state = self.state();
        if state.in_flight < self.in_flight_limit {
            state.in_flight += 1;
            ticket.claim();
            return Route::Lead(request);
        }
        let (operation, lock) = (request.operation(), request.name().to_owned());
        let (reply, answer) = oneshot::channel();
        state.queue.push_back(Queued {
            request,
            ticket: ticket.clone(),
            reply,
            since: tokio::time::Instant::now(),
        });
        Route::Queued {
            answer,
            operation,
            lock,
        }
    }

    /// Takes a queued request back to send it alone, if no batch took it yet.
    fn reclaim(&self, ticket: &Arc<Ticket>) -> Option<Request> {
        let mut state = self.state();
        let at = state
            .queue
            .iter()
            .position(|queued| Arc::ptr_eq(&queued.ticket, ticket))?;
        if !ticket.claim() {
            return None;
        }
        state.queue.remove(at).map(|queued| queued.request)
    }

    /// The request or batch in flight returned (or its sender went away): sends what
    /// queued meanwhile, in a task of its own, until nothing is queued.
    fn next(self: &Arc<Self>) {
        let Some(batch) = self.take_batch() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Made before the spawn and moved into the task: dropped unpolled (a runtime
                // shutting down) or midway, the task leaves the batcher with one sender
                // fewer, not busy with nobody to drive it.
                let driving = Driving(Some(self.clone()));
                let this = self.clone();
                let span = tracing::debug_span!("etcd batch");
                runtime.spawn(
                    async move {
                        let mut batch = batch;
                        loop {
                            this.send_batch(batch).await;
                            match this.take_batch() {
                                Some(next) => batch = next,
                                None => break,
                            }
                        }
                        driving.finished();
                    }
                    .instrument(span),
                );
            }
            Err(_) => {
                // No runtime to send from (shutting down): the waiting callers hear so.
                drop(batch);
                self.abandon();
            }
        }
    }

    /// Nothing will send what is queued: its callers hear so (their answer channels
    /// close), and the next request finds the batcher idle.
    fn abandon(&self) {
        let mut state = self.state();
        state.queue.clear();
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    /// The next batch: queued requests not withdrawn, oldest first, at most one per lock
    /// name, at most the limit of operations and [`MAX_BATCH_BYTES`] (a lone request may
    /// exceed them). A request about a name already in the batch goes out alone at once,
    /// beside it, rather than wait a round trip per request of that name. `None` (and one
    /// sender fewer in flight) when nothing is queued.
    fn take_batch(&self) -> Option<Vec<Queued>> {
        let limit = self.limit.load(Ordering::Relaxed).max(1);
        let mut state = self.state();
        let mut batch: Vec<Queued> = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        let mut left = VecDeque::new();
        let mut beside = Vec::new();
        while let Some(queued) = state.queue.pop_front() {
            if queued.reply.is_closed() {
                // Its caller went away before it was sent: withdrawn.
                queued.ticket.withdraw();
                continue;
            }
            let same_name = batch
                .iter()
                .any(|member| member.request.prefix() == queued.request.prefix());
            // A request about a lock whose earlier request stays queued stays behind it:
            // one session's requests about one lock go out in order.
            if left
                .iter()
                .any(|earlier: &Queued| earlier.request.prefix() == queued.request.prefix())
            {
                left.push_back(queued);
                continue;
            }
            let (more_ops, more_bytes) = (queued.request.ops(), queued.request.bytes());
            let fits = ops + more_ops <= limit && bytes + more_bytes <= MAX_BATCH_BYTES;
            if same_name && queued.ticket.claim() {
                beside.push(queued);
            } else if (fits || batch.is_empty() && left.is_empty()) && !same_name {
                if !queued.ticket.claim() {
                    // Withdrawn, or sent alone by its caller.
                    continue;
                }
                ops += more_ops;
                bytes += more_bytes;
                batch.push(queued);
            } else if !same_name {
                left.push_back(queued);
            }
        }
        state.queue = left;
        // Decided under the lock: a request that finds the batcher busy is queued only
        // while a sender is still bound to take it.
        let idle = batch.is_empty();
        if idle {
            state.in_flight = state.in_flight.saturating_sub(1);
        }
        drop(state);
        if !beside.is_empty() {
            self.send_beside(beside);
        }
        if idle { None } else { Some(batch) }
    }

    /// Sends each request alone, concurrently, in tasks of their own.
    fn send_beside(&self, requests: Vec<Queued>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for member in requests {
            let (kv, renewal, timeout) = (self.kv.clone(), self.renewal.clone(), self.timeout);
            runtime.spawn(
                async move {
                    let sent = member.request.send_alone(&kv, &renewal, timeout).await;
                    let _ = member.reply.send(sent);
                }
                .in_current_span(),
            );
        }
    }

    /// Sends one batch and answers each member.
    async fn send_batch(&self, batch: Vec<Queued>) {
        if batch.len() == 1 {
            for member in batch {
                let sent = member
                    .request
                    .send_alone(&self.kv, &self.renewal, self.timeout)
                    .await;
                let _ = member.reply.send(sent);
            }
            return;
        }
        let size = batch.len();
        let ops: usize = batch.iter().map(|member| member.request.ops()).sum();
        tracing::debug!(size, ops, "sending a batch");
        BATCHES.fetch_add(1, Ordering::Relaxed);
        BATCHED.fetch_add(size as u64, Ordering::Relaxed);
        // Built for each attempt rather than cloned (the same operations either way).
        let build = |batch: &[Queued]| {
            let (mut compares, mut then, mut otherwise) = (Vec::new(), Vec::new(), Vec::new());
            for member in batch {
                member
                    .request
                    .add_to(&mut compares, &mut then, &mut otherwise);
            }
            Txn::new().when(compares).and_then(then).or_else(otherwise)
        };
        let Attempts { result, ambiguous } =
            call_retrying_noting("batch", None, self.timeout, &self.renewal, || {
                let mut kv = self.kv.clone();
                let txn = build(&batch);
                async move { kv.txn(txn).await }
            })
            .await;
        match result {
            Ok(response) => {
                let revision = response.header().map(|h| h.revision());
                let succeeded = response.succeeded();
                let mut answers = response.op_responses().into_iter();
                let mut again = Vec::new();
                for member in batch {
                    let result = match (&member.request, succeeded) {
                        (Request::Join { .. }, true) => {
                            let responses: Vec<_> = answers.by_ref().take(2).collect();
                            match responses.as_slice() {
                                [TxnOpResponse::Put(_), TxnOpResponse::Get(_)] => {
                                    Ok(Answer::Join {
                                        succeeded: true,
                                        responses,
                                        revision,
                                    })
                                }
                                _ => Err(malformed_member(&member.request)),
                            }
                        }
                        (Request::Join { .. }, false) => match answers.next() {
                            Some(TxnOpResponse::Get(mine)) if mine.kvs().is_empty() => {
                                // Another member's key was there, not this one's: nothing
                                // was put; this one goes again, alone.
                                again.push(member);
                                continue;
                            }
                            Some(mine @ TxnOpResponse::Get(_)) => Ok(Answer::Join {
                                succeeded: false,
                                responses: vec![mine],
                                revision,
                            }),
                            _ => Err(malformed_member(&member.request)),
                        },
                        (Request::Delete { .. }, _) => match answers.next() {
                            Some(TxnOpResponse::Delete(deleted)) => Ok(Answer::Delete {
                                deleted: deleted.deleted(),
                                revision,
                            }),
                            _ => Err(malformed_member(&member.request)),
                        },
                    };
                    // Applied, whatever could be read of it: a member that cannot read its
                    // answer must assume the worst of it.
                    let ambiguous = ambiguous || result.is_err();
                    let _ = member.reply.send(Attempts { result, ambiguous });
                }
                for member in again {
                    if member.reply.is_closed() {
                        // Its caller left: the batch put nothing, and a join sent now would
                        // put a key nobody owns (until its cleanup or sweep found it).
                        continue;
                    }
                    let mut sent = member
                        .request
                        .send_alone(&self.kv, &self.renewal, self.timeout)
                        .await;
                    // An attempt of the batch without an answer was one of this member too.
                    sent.ambiguous |= ambiguous;
                    let _ = member.reply.send(sent);
                }
            }
            Err(err) if !may_have_applied(&err) => {
                // This attempt was refused whole: each member on its own, so that one
                // member's refusal is not another's (an earlier attempt without an answer
                // stays on each member's account).
                if err.to_string().contains("too many operations") {
                    let lower = (ops / 2).max(1);
                    self.limit.fetch_min(lower, Ordering::Relaxed);
                    tracing::warn!(lower, "etcd refused a batch as too large; batching less");
                }
                tracing::debug!(%err, size, "batch refused; sending its members alone");
                let mut alone = JoinSet::new();
                for member in batch {
                    if member.reply.is_closed() {
                        // Its caller left, and this attempt was refused: nothing to send.
                        continue;
                    }
                    let (kv, renewal) = (self.kv.clone(), self.renewal.clone());
                    let timeout = self.timeout;
                    alone.spawn(
                        async move {
                            let mut sent = member.request.send_alone(&kv, &renewal, timeout).await;
                            sent.ambiguous |= ambiguous;
                            let _ = member.reply.send(sent);
                        }
                        .in_current_span(),
                    );
                }
                while alone.join_next().await.is_some() {}
            }
            Err(err) => {
                tracing::debug!(%err, size, "batch without an answer");
                for member in batch {
                    let result = Err(copy_error(&err, &member.request, member.since.elapsed()));
                    let _ = member.reply.send(Attempts {
                        result,
                        ambiguous: true,
                    });
                }
            }
        }
    }
}

/// How one request goes out.
enum Route {
    /// Batching is off.
    Alone(Request),
    /// Nothing was in flight: this request goes at once, and what queues behind it after.
    Lead(Request),
    /// Something is in flight: the answer comes from the next batch.
    Queued {
        answer: oneshot::Receiver<Sent>,
        operation: &'static str,
        lock: String,
    },
}

/// Starts what queued once the request in flight returns, also if its sender's future is
/// dropped mid-flight.
struct Turn(Option<Arc<Batcher>>);

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(batcher) = self.0.take() {
            batcher.next();
        }
    }
}

/// Held by the task that sends batches; see [`Batcher::abandon`].
struct Driving(Option<Arc<Batcher>>);

impl Driving {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        if let Some(batcher) = self.0.take() {
            batcher.abandon();
        }
    }
}
