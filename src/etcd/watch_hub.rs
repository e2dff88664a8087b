//! One watch stream per client, and on it one watch per lock name (its whole prefix,
//! deletions only), shared by every waiter and every holder of that lock in the client,
//! kept open for a while after the last one leaves (`watch_state::LINGER`). What the watches know and decide
//! is in `watch_state.rs`; this module carries out its actions (open, cancel, check by
//! read) and feeds it the server's answers.
//!
//! A watch that already exists is in etcd's "synced" group and delivers a deletion at
//! once. A watch created per wait races with the commits around it: etcd turns "no start
//! revision" into `current + 1` before it registers the watcher, so a commit in between
//! puts it in the "unsynced" group, which a loop catches up only every 100 ms
//! (`mvcc/watchable_store.go`, `syncWatchersLoop`), and a contended handoff waits for that
//! loop (measured: p99 ~90 ms). Holders open a lock's watch from the revision after their
//! grant (no read needed, and no hurry); waiters use the open one, or open one from now
//! and read their place again once it exists.
//!
//! Followers register under a lock shared with the task, so a grant costs no hop to the
//! task; only opening and closing watches does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::WatchResponse;
use etcd_client::{Client, EventType, GetOptions, KvClient, WatchFilterType, WatchOptions};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::call::call_retrying;
use super::token_renewal::TokenRenewal;
pub(crate) use super::watch_state::EndReason;
pub(crate) use super::watch_state::OnLost;
use super::watch_state::{Action, HubState, KeyLoss, Registered, Signal};
use super::watch_stream::{Read, WatchStream};
use super::watch_token::{Check, STALE_TOKEN, TokenRefresh, TokenRefusal, check_read};
use crate::LossReason;

/// How long opening the watch stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a read that checks held keys may take per attempt.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause before a failed watch (or check) is tried again.
const RETRY: Duration = Duration::from_millis(250);

/// Handle to the client's watch task. The task stops when the last handle is dropped.
#[derive(Debug)]
pub(crate) struct WatchHub {
    shared: Arc<Shared>,
    /// The task, to stop it as a fault would (tests of what waiters hear then).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    task: tokio::task::AbortHandle,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<HubState>,
    actions: mpsc::UnboundedSender<Vec<Action>>,
    /// Set when the task has stopped (a panic, an abort): the waiters' signals come from
    /// the state, whose senders outlive the task, so they would never hear of it.
    stopped: Arc<tokio::sync::watch::Sender<bool>>,
    /// How many turns the task has taken (passes of its loop, each ending in one arm of
    /// its select): short holds must not cost one each (`watch_timers.rs`); tests read it.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    turns: Arc<AtomicU64>,
}

/// Sets [`Shared::stopped`] when dropped with the task's future, however it ends.
struct StopSignal(Arc<tokio::sync::watch::Sender<bool>>);

impl Drop for StopSignal {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn perform(&self, actions: Vec<Action>) {
        if !actions.is_empty() {
            let _ = self.actions.send(actions);
        }
    }
}

impl WatchHub {
    pub(crate) fn start(client: Client, renewal: TokenRenewal) -> Self {
        let (actions, receiver) = mpsc::unbounded_channel();
        let stopped = Arc::new(tokio::sync::watch::Sender::new(false));
        let turns = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            state: Mutex::new(HubState::default()),
            actions,
            stopped: stopped.clone(),
            turns: turns.clone(),
        });
        let task = HubTask {
            kv: super::answers::kv(&client),
            client,
            renewal,
            stream_seen: 0,
            shared: Arc::downgrade(&shared),
            stream: None,
            checks: JoinSet::new(),
            next_retry: None,
            tokens: TokenRefresh::default(),
            turns,
            _stop_signal: StopSignal(stopped),
        };
        let task = tokio::spawn(task.run(receiver)).abort_handle();
        Self { shared, task }
    }

    /// Stops the watch task as a panic in it would (a fault for tests).
    #[cfg(feature = "testkit")]
    pub(crate) fn stop_task(&self) {
        self.task.abort();
    }

    /// How many turns the watch task has taken so far (a test's count of its wake-ups:
    /// passes of its loop).
    #[cfg(feature = "testkit")]
    pub(crate) fn turns(&self) -> u64 {
        self.shared.turns.load(Ordering::Relaxed)
    }

    /// Whether the lock's watch is open (or being opened): following it before a join
    /// then costs nothing, where opening a watch for every try would cost a request even
    /// when nobody waits.
    pub(crate) fn is_open(&self, prefix: &str) -> bool {
        self.shared.state().is_open(prefix.as_bytes())
    }

    /// Follows the deletions under the lock prefix `prefix`, opening the lock's watch from
    /// now if it is not open. Dropping the subscription unsubscribes.
    pub(crate) fn subscribe(&self, prefix: &Arc<str>) -> Subscription {
        let prefix = bytes(prefix);
        let (signals, receiver) = mpsc::unbounded_channel();
        let mut actions = Vec::new();
        let follower =
            self.shared
                .state()
                .subscribe(&prefix, signals, Instant::now(), &mut actions);
        self.shared.perform(actions);
        Subscription {
            prefix,
            follower,
            receiver,
            shared: self.shared.clone(),
        }
    }

    /// Follows `key` (not joined yet, or waiting) on the lock's watch, if it is open.
    pub(crate) fn track(&self, prefix: &Arc<str>, key: &Arc<str>) -> Option<TrackedKey> {
        let (prefix, key) = (bytes(prefix), bytes(key));
        let registered = self.shared.state().track(&prefix, &key)?;
        Some(self.tracked(prefix, key, registered))
    }

    /// Follows `key`, granted at once with create revision `token`, for as long as it is
    /// held: on the lock's watch, opened from the revision after the grant if there is
    /// none.
    pub(crate) fn hold(
        &self,
        prefix: &Arc<str>,
        key: &Arc<str>,
        token: i64,
        on_lost: OnLost,
    ) -> TrackedKey {
        let (prefix, key) = (bytes(prefix), bytes(key));
        let mut actions = Vec::new();
        let registered = self.shared.state().hold(
            &prefix,
            &key,
            token,
            Some(on_lost),
            Instant::now(),
            &mut actions,
        );
        self.shared.perform(actions);
        self.tracked(prefix, key, registered)
    }

    fn tracked(&self, prefix: Arc<[u8]>, key: Arc<[u8]>, registered: Registered) -> TrackedKey {
        TrackedKey {
            prefix,
            key,
            follower: registered.follower,
            loss: registered.loss,
            shared: self.shared.clone(),
        }
    }
}

/// The same allocation as bytes: the hub's tables key on bytes (what watch events carry),
/// and share the acquisition's names instead of copying them.
fn bytes(text: &Arc<str>) -> Arc<[u8]> {
    Arc::from(text.clone())
}

/// One acquisition's key followed on its lock's watch, then its guard's: it learns when
/// the key is deleted under a live lease. Dropping it stops following.
#[derive(Debug)]
pub(crate) struct TrackedKey {
    prefix: Arc<[u8]>,
    key: Arc<[u8]>,
    follower: u64,
    loss: Arc<KeyLoss>,
    shared: Arc<Shared>,
}

impl TrackedKey {
    /// The join is answered: the key's create revision is `token`. Returns whether the
    /// key is already known gone.
    pub(crate) fn settle(&self, token: i64) -> bool {
        self.shared
            .state()
            .settle_token(&self.prefix, &self.key, self.follower, token)
    }

    /// The lock is held on this key, seen alive at `verified_through`; `on_lost` decides
    /// a loss. Returns whether the key is already known gone.
    pub(crate) fn hold(&self, verified_through: i64, on_lost: OnLost) -> bool {
        let mut actions = Vec::new();
        let lost = self.shared.state().hold_tracked(
            &self.prefix,
            &self.key,
            self.follower,
            verified_through,
            Some(on_lost),
            &mut actions,
        );
        self.shared.perform(actions);
        lost
    }

    /// Whether the key is known deleted, or can no longer be followed (the watch task
    /// stopped: a deletion would go unseen).
    pub(crate) fn is_lost(&self) -> bool {
        self.loss.is_lost() || *self.shared.stopped.borrow()
    }

    /// Resolves once the key is known deleted under a live lease (a key that went with
    /// its lease never resolves this: the session's loss tells that), or once the watch
    /// task has stopped, with the reason.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub(crate) async fn lost(&self) -> LossReason {
        let mut stopped = self.shared.stopped.subscribe();
        tokio::select! {
            biased;
            () = self.loss.wait() => LossReason::KeyDeleted,
            _ = stopped.wait_for(|stopped| *stopped) => LossReason::Unwatched,
        }
    }
}

impl Drop for TrackedKey {
    fn drop(&mut self) {
        let mut actions = Vec::new();
        self.shared.state().untrack(
            &self.prefix,
            &self.key,
            self.follower,
            Instant::now(),
            &mut actions,
        );
        self.shared.perform(actions);
    }
}

/// One waiter's share of a lock watch.
#[derive(Debug)]
pub(crate) struct Subscription {
    prefix: Arc<[u8]>,
    follower: u64,
    receiver: mpsc::UnboundedReceiver<Signal>,
    shared: Arc<Shared>,
}

/// What a waiter hears next.
#[derive(Debug)]
pub(crate) enum Heard {
    /// Every deletion after this revision reaches the waiter.
    Covered(i64),
    /// All the deletions of one revision.
    Deleted(i64, Vec<Vec<u8>>),
    /// The watch lost continuity or was refused: read again (and subscribe again).
    Ended(EndReason),
}

impl Subscription {
    /// The next signal; `Ended(Stopped)` once the watch task has stopped (after the
    /// signals it sent before).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal not yet taken stays queued.
    pub(crate) async fn next(&mut self) -> Heard {
        let mut stopped = self.shared.stopped.subscribe();
        let signal = tokio::select! {
            biased;
            signal = self.receiver.recv() => signal,
            _ = stopped.wait_for(|stopped| *stopped) => None,
        };
        match signal {
            Some(Signal::Covered(revision)) => Heard::Covered(revision),
            Some(Signal::Deleted(revision, keys)) => Heard::Deleted(revision, keys),
            Some(Signal::Ended(why)) => Heard::Ended(why),
            None => Heard::Ended(EndReason::Stopped),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut actions = Vec::new();
        self.shared
            .state()
            .unsubscribe(&self.prefix, self.follower, Instant::now(), &mut actions);
        self.shared.perform(actions);
    }
}

/// What a refused watch said of the stream's auth token.
enum Token {
    /// Not known to be stale: the answer is handled as it came.
    NotKnownStale,
    /// Stale, renewed, and the stream given up.
    Renewed,
    /// Stale, but it could not be renewed.
    StaleNotRenewed,
}

/// The result of a read that checks the held keys of one prefix (an error: why, and
/// whether it was a refusal).
type Checked = (Vec<u8>, Result<(i64, Vec<(Vec<u8>, i64)>), (String, bool)>);

struct HubTask {
    client: Client,
    kv: KvClient,
    /// The client's token renewal (`token_renewal.rs`), shared with its unary calls.
    renewal: TokenRenewal,
    /// The renewals made before the stream opened ([`TokenRenewal::seen`]): a refusal of
    /// the stream's token renews it only if none was made since.
    stream_seen: u64,
    /// Weak: the task ends with the last hub handle.
    shared: std::sync::Weak<Shared>,
    stream: Option<WatchStream>,
    checks: JoinSet<Checked>,
    /// When failed watches are asked for again.
    next_retry: Option<Instant>,
    /// When a refused watch makes the client authenticate again (`watch_token.rs`).
    tokens: TokenRefresh,
    /// [`Shared::turns`].
    turns: Arc<AtomicU64>,
    /// Tells the waiters when the task's future is dropped.
    _stop_signal: StopSignal,
}

impl HubTask {
    async fn run(mut self, mut actions: mpsc::UnboundedReceiver<Vec<Action>>) {
        loop {
            self.turns.fetch_add(1, Ordering::Relaxed);
            let Some(mut wake) = self.plan_wake() else {
                return;
            };
            // Something due already is run once per turn, before the select: there it
            // would have to win against arms that stay ready (a held lock's deferred
            // watch asked for late, its loss told late). Then one arm of the select runs,
            // so that timers cannot starve the rest either. The actions already queued go
            // first, as one batch (one stream open at most, where the stream is down),
            // taken without waiting: `try_recv` would block the thread on a send in
            // progress.
            if wake.is_some_and(|wake| wake <= Instant::now()) {
                let mut queued = Vec::new();
                for _ in 0..actions.len() {
                    match actions.recv().now_or_never() {
                        Some(Some(batch)) => queued.extend(batch),
                        Some(None) | None => break,
                    }
                }
                self.perform(queued).await;
                self.run_due().await;
                let Some(replanned) = self.plan_wake() else {
                    return;
                };
                wake = replanned;
            }
            // Answers read while a request waited for room on the stream (see
            // `watch_stream.rs`) are handled in the turn that read them: a turn sends up
            // to a batch of requests but takes one arm below, so answers would otherwise
            // pile up faster than they are handled (a watch's creation, or a deletion,
            // told seconds late).
            if self.handle_kept().await {
                let Some(replanned) = self.plan_wake() else {
                    return;
                };
                wake = replanned;
            }
            // No arm comes first (tokio picks among the ready ones at random): a channel
            // of actions that stays ready must not keep the stream's answers unread, nor
            // a busy stream the actions unsent.
            tokio::select! {
                batch = actions.recv() => match batch {
                    Some(batch) => self.perform(batch).await,
                    None => return,
                },
                read = next_response(self.stream.as_mut()) => self.handle(read).await,
                Some(checked) = self.checks.join_next(), if !self.checks.is_empty() => {
                    if let Ok(checked) = checked {
                        self.checked(checked).await;
                    }
                }
                () = sleep_until_opt(wake) => self.run_due().await,
            }
        }
    }

    /// Handles the answers the stream read while requests waited, as many as it holds
    /// now (handling one may send requests, and those may read more: the next turn's);
    /// returns whether there were any.
    async fn handle_kept(&mut self) -> bool {
        let kept = self.stream.as_ref().map_or(0, WatchStream::kept);
        for _ in 0..kept {
            match self.stream.as_mut().and_then(WatchStream::take_kept) {
                Some(read) => self.handle(read).await,
                // The stream broke meanwhile and none is open: what it read went with it
                // (its watches are asked for again). Where a new one opened, its answers
                // are taken above, in order.
                None => break,
            }
        }
        kept > 0
    }

    /// Handles what reading the stream gave.
    async fn handle(&mut self, read: Read) {
        match read {
            Ok(Some(response)) => self.dispatch(&response).await,
            Ok(None) => self.broken("watch stream ended").await,
            Err(err) => self.broken(&err.to_string()).await,
        }
    }

    /// When the task wakes next (the timers' plan, and the retry of failed watches);
    /// `None` once the hub is gone.
    fn plan_wake(&mut self) -> Option<Option<Instant>> {
        let shared = self.shared.upgrade()?;
        let (failing, due) = {
            let mut state = shared.state();
            (state.has_failing(), state.next_timer(Instant::now()))
        };
        self.next_retry = match (failing, self.next_retry) {
            (false, _) => None,
            (true, None) => Some(Instant::now() + RETRY),
            (true, retry) => retry,
        };
        Some([self.next_retry, due].into_iter().flatten().min())
    }

    /// Runs the timers that are due, and the retry of failed watches if that is due.
    async fn run_due(&mut self) {
        let mut more = Vec::new();
        let now = Instant::now();
        let retry = self.next_retry.is_some_and(|due| due <= now);
        if retry {
            self.next_retry = None;
        }
        if let Some(shared) = self.shared.upgrade() {
            let mut state = shared.state();
            state.run_timers(now, &mut more);
            if retry {
                state.retry_failing(&mut more);
            }
        }
        self.perform(more).await;
    }

    /// Carries out `actions`, and whatever they lead to.
    async fn perform(&mut self, actions: Vec<Action>) {
        let mut queue = std::collections::VecDeque::from(actions);
        // Once a stream could not be opened in this batch, the other watches fail at once
        // instead of each waiting out the open timeout in turn.
        let mut unreachable: Option<String> = None;
        while let Some(action) = queue.pop_front() {
            let more = match action {
                Action::Open { prefix, id, start } => match &unreachable {
                    Some(why) => self.failed_open(id, why),
                    None => {
                        let (more, failed) = self.open(prefix, id, start).await;
                        unreachable = failed;
                        more
                    }
                },
                Action::Cancel { id } => {
                    let failed = match &mut self.stream {
                        Some(stream) => stream.cancel(id).await.err(),
                        None => None,
                    };
                    match failed {
                        Some(err) => self.stream_lost(&err.to_string()),
                        None => Vec::new(),
                    }
                }
                Action::Verify { prefix } => {
                    self.check(prefix, Duration::ZERO);
                    Vec::new()
                }
                // The loop works out its next wake-up on its next turn.
                Action::Wake => Vec::new(),
            };
            queue.extend(more);
        }
    }

    /// The stream is gone (a request could not be sent on it): every watch on it is asked
    /// for again on a new one. Returns what that takes.
    fn stream_lost(&mut self, why: &str) -> Vec<Action> {
        tracing::debug!(why, "watch stream lost");
        self.stream = None;
        let mut more = Vec::new();
        if let Some(shared) = self.shared.upgrade() {
            shared.state().stream_broken(&mut more);
        }
        more
    }

    /// Watch `id` could not be asked for: its followers are told (see
    /// `HubState::open_failed`).
    fn failed_open(&mut self, id: i64, why: &str) -> Vec<Action> {
        let mut more = Vec::new();
        if let Some(shared) = self.shared.upgrade() {
            shared.state().open_failed(id, why, &mut more);
        }
        more
    }

    /// Sends a watch request, opening the stream first if there is none. Returns what that
    /// leads to, and why no stream could be opened (if so).
    async fn open(
        &mut self,
        prefix: Vec<u8>,
        id: i64,
        start: i64,
    ) -> (Vec<Action>, Option<String>) {
        // Asked for again meanwhile (the stream broke): only the newest request counts,
        // or the server would keep a watch nobody reads. Recorded as sent here, where it
        // goes out: `pending` must be in the order sent.
        let current = self
            .shared
            .upgrade()
            .is_some_and(|shared| shared.state().sending(&prefix, id));
        if !current {
            return (Vec::new(), None);
        }
        let mut options = WatchOptions::new()
            .with_watch_id(id)
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        if start > 0 {
            options = options.with_start_revision(start);
        }
        let sent = match &mut self.stream {
            // A request that cannot be sent means the stream is gone, for every watch on
            // it: all of them are asked for again (this one too).
            Some(stream) => match stream.watch(prefix, options).await {
                Ok(()) => Ok(()),
                Err(err) => return (self.stream_lost(&err.to_string()), None),
            },
            // Bounded: a hub stuck on an unreachable member would stall every wait.
            None => {
                let mut watch = super::answers::watch(&self.client);
                let seen = self.renewal.seen();
                match tokio::time::timeout(OPEN_TIMEOUT, watch.watch(prefix, Some(options))).await {
                    Ok(Ok(stream)) => {
                        self.stream = Some(WatchStream::new(stream));
                        self.stream_seen = seen;
                        Ok(())
                    }
                    Ok(Err(err)) => Err(err.to_string()),
                    Err(_) => Err("opening the watch stream timed out".into()),
                }
            }
        };
        match sent {
            Ok(()) => (Vec::new(), None),
            Err(why) => {
                tracing::debug!(%why, "could not open the watch stream");
                self.stream = None;
                (self.failed_open(id, &why), Some(why))
            }
        }
    }

    async fn dispatch(&mut self, response: &WatchResponse) {
        let stale_reason;
        let reason = match self.stale_token(response).await {
            Token::Renewed => return,
            // Proved stale, not renewed: a gap (asked for again after a pause), never a
            // refusal told to waiters.
            Token::StaleNotRenewed => {
                stale_reason = format!("{STALE_TOKEN} ({})", response.cancel_reason());
                &stale_reason
            }
            Token::NotKnownStale => response.cancel_reason(),
        };
        let deletions: Vec<(Vec<u8>, i64)> = response
            .events()
            .iter()
            .filter(|event| event.event_type() == EventType::Delete)
            .filter_map(|event| event.kv())
            .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
            .collect();
        let mut more = Vec::new();
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        shared.state().on_response(
            response.watch_id(),
            response.created(),
            response.canceled(),
            response.compact_revision(),
            reason,
            response.header().map_or(0, |h| h.revision()),
            &deletions,
            &mut more,
        );
        drop(shared);
        self.perform(more).await;
    }

    /// What `response` says of the stream's auth token, renewing it (and giving up the
    /// stream: every watch is asked for again on a new one) when it is stale; see
    /// `watch_token.rs` for how a refusal is told to be that.
    async fn stale_token(&mut self, response: &WatchResponse) -> Token {
        if !response.canceled() || response.compact_revision() != 0 {
            return Token::NotKnownStale;
        }
        let Some(refusal) = TokenRefusal::of(response.cancel_reason()) else {
            return Token::NotKnownStale;
        };
        let now = Instant::now();
        if !self.tokens.may_refresh(now) {
            return Token::NotKnownStale;
        }
        if refusal == TokenRefusal::Maybe {
            let prefix = self.shared.upgrade().and_then(|shared| {
                shared
                    .state()
                    .answered_prefix(response.watch_id(), response.created())
            });
            let Some(prefix) = prefix else {
                return Token::NotKnownStale;
            };
            if !self.tokens.may_check(&prefix, now) {
                return Token::NotKnownStale;
            }
            match check_read(self.kv.clone(), &prefix, VERIFY_TIMEOUT).await {
                Check::Allowed => self.tokens.allowed(&prefix),
                Check::Stale => {}
                Check::Denied | Check::Unknown => {
                    self.tokens.denied(&prefix, Instant::now());
                    return Token::NotKnownStale;
                }
            }
        }
        self.tokens.refreshing(Instant::now());
        // Bounded: the task reads no answer meanwhile, and a stalled member would stall
        // every watch of the client. Nothing to authenticate if the client's unary calls
        // renewed the token since the stream opened: a new stream takes the new token.
        if let Err(err) = self.renewal.renew(self.stream_seen, VERIFY_TIMEOUT).await {
            tracing::debug!(%err, "could not authenticate again for the watch stream");
            return Token::StaleNotRenewed;
        }
        self.broken("a watch was refused for the stream's auth token")
            .await;
        Token::Renewed
    }

    /// Every watch on a broken stream is asked again on a new one.
    async fn broken(&mut self, why: &str) {
        tracing::debug!(why, "watch stream closed");
        self.stream = None;
        let mut more = Vec::new();
        if let Some(shared) = self.shared.upgrade() {
            shared.state().stream_broken(&mut more);
        }
        self.perform(more).await;
    }

    /// Reads the live keys under `prefix` (after `delay`), to check the held keys there.
    fn check(&mut self, prefix: Vec<u8>, delay: Duration) {
        let (kv, renewal) = (self.kv.clone(), self.renewal.clone());
        self.checks.spawn(async move {
            tokio::time::sleep(delay).await;
            let options = GetOptions::new().with_prefix().with_keys_only();
            let read = call_retrying("watch check", None, VERIFY_TIMEOUT, &renewal, || {
                let (mut kv, prefix, options) = (kv.clone(), prefix.clone(), options.clone());
                async move { kv.get(prefix, Some(options)).await }
            })
            .await;
            let result = read
                .map(|read| {
                    let revision = read.header().map_or(0, |h| h.revision());
                    let live = read
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                        .collect();
                    (revision, live)
                })
                .map_err(|err| (err.to_string(), err.is_permission_denied()));
            (prefix, result)
        });
    }

    async fn checked(&mut self, (prefix, result): Checked) {
        match result {
            Ok((revision, live)) => {
                if let Some(shared) = self.shared.upgrade() {
                    shared.state().verified(&prefix, revision, &live);
                }
            }
            // Again while keys are still held there; a refusal will not change.
            Err((why, denied)) => {
                let followed = self
                    .shared
                    .upgrade()
                    .is_some_and(|shared| shared.state().holds_keys(&prefix));
                if followed && !denied {
                    tracing::debug!(%why, "could not check held keys; retrying");
                    self.check(prefix, RETRY);
                }
            }
        }
    }
}

async fn next_response(stream: Option<&mut WatchStream>) -> Read {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
