//! Taking a Redis or Redlock lock (a semaphore's permit, several locks at once: what is
//! taken is a [`Target`]): attempt, and while taken, wait for a release message (on any
//! of the target's channels; several locks: on the channel of the lock the refusal
//! registered with) or a bounded, jittered sleep, whichever comes first.
//!
//! Cancel safety comes from the owner value rather than a task: see [`acquire`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use tracing::Instrument;

use super::core::Core;
use super::node::{Attempt, Node};
use super::owner::{jittered, jittered_down, owner_value};
use super::subscriber::{Interest, Subscriber};
use super::target::{Grantee, Target};
use super::value::{lock_value, set_owner};
use super::waiter::{Registration, waiter};
use crate::lease_clock::Clock;
use crate::retry::backoff;
use crate::{LockError, LockOptions};

/// How often a waiter without release messages (Redlock) retries at most: the usual
/// Redlock client behaviour of a short random delay between attempts.
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// How long a Redlock attempt waits for one master's answer: the request timeout, but
/// never more than a tenth of the TTL (the Redlock description asks for a timeout much
/// shorter than the TTL, so that a master that does not answer costs little of the
/// lock's validity).
fn per_master_timeout(request_timeout: Duration, ttl: Duration) -> Duration {
    request_timeout.min(ttl / 10)
}

/// Runs one acquisition of `target`. `wait`: queue up (`lock`) or not (`try_lock`).
///
/// # Cancel safety
///
/// The attempts use a random owner value, and a lock key can only ever hold that value if
/// one of our attempts set it. If this future is dropped (while an attempt is in flight,
/// or between attempts), a compare-and-delete with that owner value of every key the
/// target may have taken is sent in the background, on every server: on each connection
/// it queues behind the attempt (on a connection replaced in between as silent, a copy
/// is sent on the replaced one too, `command_conn.rs`), so it removes a key if the
/// attempt set it and does nothing otherwise. The value changes only once what the old
/// one may have set is seen to (undone; or left to the task that reads a Redlock
/// attempt's late masters and undoes what they granted; or, on a master that answered
/// neither the attempt nor its undo, to the TTL). An attempt's bytes that reach a single Redis only after every copy of
/// their undo (a connection replaced longer ago than `command_conn.rs` keeps it, the
/// undo sent on the new one alone) set a key with the old value, which nobody holds any
/// more: it stays until its TTL (docs/redis.md, "a key nobody owns"). No task is spawned
/// on the way in.
pub(crate) async fn acquire<T: Target>(
    core: &Arc<Core>,
    subscriber: Option<&Arc<Subscriber>>,
    target: T,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<T::Taken>, LockError> {
    let backend = core.backend;
    let name = target.label().clone();
    let counted = std::time::Instant::now();
    let result = acquire_uncounted(core, subscriber, target, options, wait).await;
    crate::metrics::acquisition(backend, &name, counted, &result);
    result
}

async fn acquire_uncounted<T: Target>(
    core: &Arc<Core>,
    subscriber: Option<&Arc<Subscriber>>,
    target: T,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<T::Taken>, LockError> {
    let owner = owner_value();
    let value = lock_value(&owner, options.holder_record());
    let mut acquisition = Acquisition {
        name: target.label().clone(),
        target,
        core,
        subscriber,
        owner,
        value,
        options: options.clone(),
        started: Instant::now(),
        waits: wait,
        armed: true,
        registration: Registration::default(),
        uncertain: false,
        failures: 0,
        last_error: None,
    };
    // The wait timeout bounds every step: attempts, subscribing, sleeping. Cut short,
    // the acquisition's drop cleans up after an attempt that may be in flight.
    let deadline = options
        .wait_timeout()
        .filter(|_| wait)
        .map(|timeout| (acquisition.started + timeout, timeout));
    let mut cut_short = false;
    let outcome = match deadline {
        Some((deadline, timeout)) => {
            match tokio::time::timeout_at(deadline, acquisition.run(wait)).await {
                Ok(outcome) => outcome,
                // Cut short in a request: the last request error if the one before
                // failed too, else a wait timeout.
                Err(_) => Err({
                    cut_short = true;
                    acquisition
                        .last_error
                        .take()
                        .unwrap_or_else(|| LockError::WaitTimeout {
                            name: acquisition.name.to_string(),
                            waited: timeout,
                        })
                }),
            }
        }
        None => acquisition.run(wait).await,
    };
    // A granted lock now belongs to its guard; a refused attempt set nothing (Redlock
    // undoes partial grants itself), and a wait timeout the loop returned came after a
    // refused attempt. A failed request may have been applied without our knowing, and
    // so may an attempt the deadline cut short in flight (its SET lands after we gave
    // up): both are cleaned up (a compare-and-delete of our own value, harmless if
    // nothing was set).
    acquisition.armed = cut_short || matches!(&outcome, Err(err) if !err.is_wait_timeout());
    outcome
}

/// Borrows the locker's core and subscriber (cloned only by a cleanup that outlives it):
/// every task's acquisition cloning the same `Arc`s made their counts a cache line that
/// the runtime's threads passed back and forth on every lock cycle.
struct Acquisition<'a, T: Target> {
    core: &'a Arc<Core>,
    subscriber: Option<&'a Arc<Subscriber>>,
    /// The lock's name (several locks: their names joined by commas).
    name: Arc<str>,
    target: T,
    owner: Arc<str>,
    /// What the key gets: the owner value, then the holder record if any (`value.rs`).
    /// Dropped with the acquisition: the guard keeps only the owner.
    value: Vec<u8>,
    options: LockOptions,
    started: Instant,
    /// Whether it waits until granted (`lock`), or answers after one attempt (`try_lock`).
    waits: bool,
    /// Whether dropping this must clean up after a possibly applied attempt.
    armed: bool,
    /// Our registration in the lock's waiters' set (several locks: in the set of the
    /// held lock the last refusal found expiring last; single Redis only: Redlock waiters
    /// poll and never register).
    registration: Registration,
    /// Whether a failed attempt may have set the lock with our owner value (undone
    /// before the next attempt).
    uncertain: bool,
    /// Failed requests in a row, for the backoff.
    failures: u32,
    /// The last request error, while no later attempt got an answer.
    last_error: Option<LockError>,
}

impl<T: Target> Drop for Acquisition<'_, T> {
    fn drop(&mut self) {
        // A waiter that gives up (timed out, failed, dropped) leaves the waiters' set, so
        // that releases stop publishing for it; best effort: its registration expires.
        let waiter = self.registration.take_for_cleanup();
        if !self.armed && waiter.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (core, target, owner, name, armed) = (
            self.core.clone(),
            self.target.clone(),
            std::mem::take(&mut self.owner),
            std::mem::take(&mut self.name),
            self.armed,
        );
        runtime.spawn(async move {
            if armed {
                if let Err(err) = target.undo(&core, &owner, &name).await {
                    tracing::debug!(%err, lock = %name, "cleanup after an abandoned attempt failed; the TTL will");
                }
            }
            if let Some(waiter) = waiter {
                if let Err(err) = target.unregister(&core, &waiter, &name).await {
                    tracing::debug!(%err, lock = %name, "unregistering a waiter that gave up failed; its registration expires");
                }
            }
        });
    }
}

impl<T: Target> Acquisition<'_, T> {
    async fn run(&mut self, wait: bool) -> Result<Option<T::Taken>, LockError> {
        let deadline = self.options.wait_timeout().map(|t| self.started + t);
        // One per release channel of the target, once subscribed (none before).
        let mut interests: Vec<Interest> = Vec::new();
        // How many pub/sub connections the subscriber had opened at the last attempt.
        let mut connections: Option<u64> = None;
        loop {
            // Armed before the attempt: a release published while it runs still wakes us.
            let notifies: Vec<_> = interests.iter().map(Interest::notify).collect();
            let mut notified: Vec<Pin<Box<Notified<'_>>>> =
                notifies.iter().map(|n| Box::pin(n.notified())).collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            if self.uncertain {
                // An earlier attempt failed and may have been applied: the lock may hold
                // our owner value, and we would wait out our own TTL. Undo it first
                // (single Redis: a Redlock attempt cleans up after itself).
                match self.undo().await {
                    Ok(()) => {
                        self.uncertain = false;
                        // A new value after an undo: whatever of the old one might still
                        // land later (an earlier undo that failed) can never delete a key
                        // of the next attempt's. (The attempt's own `SET`, landing later,
                        // leaves a key of the old value, nobody's, until its TTL.)
                        self.new_owner();
                    }
                    Err(err) => {
                        self.retry_after(err, deadline).await?;
                        continue;
                    }
                }
            }
            if let Some(interest) = interests.first() {
                // A new pub/sub connection since the last attempt: the old one was lost,
                // maybe with the server's data (a restart empties the waiters' sets). The
                // next refusal registers again, or releases might publish for no one.
                let opened = interest.connections_opened();
                if connections.replace(opened).is_some_and(|was| was != opened) {
                    self.registration.unsure();
                }
            }
            let sent = Clock::BOOT.now();
            // Registered only while subscribed: a release that sees the registration
            // publishes, and the subscription (armed above) hears it.
            let listening = !interests.is_empty();
            // The registration is counted from the sending: it reached the server later.
            let attempt_sent = Instant::now();
            let (remaining, wake_on) = match self.attempt(listening).await {
                Ok(Attempt::Granted(grant)) => {
                    // A lock's holder stays registered until its release unregisters it;
                    // a grant in one script unregistered it already.
                    let in_script = self.target.registers_in_script();
                    let grantee = Grantee {
                        core: self.core,
                        owner: &self.owner,
                        waiter: self.registration.for_guard(in_script),
                        options: &self.options,
                        sent,
                    };
                    let taken = self.target.taken(grant, grantee).await?;
                    self.registration.handed();
                    return Ok(Some(taken));
                }
                Ok(Attempt::Held {
                    remaining,
                    registered,
                    wake_on,
                }) => {
                    self.failures = 0;
                    self.last_error = None;
                    if registered {
                        self.registration.registered(attempt_sent, wake_on);
                    }
                    (remaining, wake_on)
                }
                // A waiting acquisition rides out a server restart or a dropped
                // connection: it retries, with a backoff, within its wait timeout.
                Err(err) if wait && err.is_unavailable() => {
                    // (A Redlock attempt cleaned up after itself already.)
                    self.uncertain = self.core.nodes.len() == 1;
                    self.registration.unsure();
                    // The pub/sub connection may have died with the server's, maybe
                    // without closing: checked now rather than at its next ping.
                    if let Some(interest) = interests.first() {
                        interest.check_connection();
                    }
                    self.retry_after(err, deadline).await?;
                    continue;
                }
                Err(err) => return Err(err),
            };
            if !wait {
                return Ok(None);
            }
            if let (true, Some(subscriber)) = (interests.is_empty(), &self.subscriber) {
                // Subscribe (to every lock's channel, at once), then try again at once: a
                // holder may have released between our attempt and the subscription.
                interests = subscriber.interests(&self.target.channels()).await;
                continue;
            }
            // Never past the holder's expiry (a set's: that of the lock registered with,
            // the one that expires last), never longer than the configured bound; with no
            // release message to wake us (Redlock), retry at least every RETRY_DELAY.
            let bound = match &self.subscriber {
                Some(_) => self.core.config.max_wait_sleep,
                None => self.core.config.max_wait_sleep.min(RETRY_DELAY),
            };
            let sleep = wait_sleep(remaining, bound);
            // A set registered with one lock: only that lock's release can let the next
            // attempt succeed (the others' messages are other waiters').
            if let Some(lock) = wake_on.filter(|&lock| lock < notified.len()) {
                notified.swap(0, lock);
                notified.truncate(1);
            }
            tokio::select! {
                () = any_notified(&mut notified) => {}
                () = tokio::time::sleep(sleep) => {}
                () = sleep_until_opt(deadline) => return Err(self.wait_ended()),
            }
        }
    }

    /// After a failed request: remembers `err` (what the wait ends with if it runs out
    /// before an attempt gets an answer) and sleeps the backoff, or ends the wait if its
    /// deadline comes first.
    async fn retry_after(
        &mut self,
        err: LockError,
        deadline: Option<Instant>,
    ) -> Result<(), LockError> {
        self.failures = self.failures.saturating_add(1);
        // After a Redis restart or a dropped connection: 100 ms, doubling, at most 1 s.
        let pause = jittered(backoff(self.failures, Duration::from_secs(1)));
        tracing::debug!(%err, ?pause, lock = %self.name, "acquire attempt failed; retrying within the wait");
        self.last_error = Some(err);
        tokio::select! {
            () = tokio::time::sleep(pause) => Ok(()),
            () = sleep_until_opt(deadline) => Err(self.wait_ended()),
        }
    }

    /// The error a wait that ran out ends with: the last request error if the last
    /// attempt got no answer (the server was unreachable, not the lock taken), else a
    /// wait timeout.
    fn wait_ended(&mut self) -> LockError {
        self.last_error
            .take()
            .unwrap_or_else(|| LockError::WaitTimeout {
                name: self.name.to_string(),
                waited: self.options.wait_timeout().unwrap_or_default(),
            })
    }

    /// Compare-and-delete of every key with our owner value: removes what an attempt
    /// whose answer was lost may have set.
    async fn undo(&self) -> Result<(), LockError> {
        self.target.undo(self.core, &self.owner, &self.name).await
    }

    /// One attempt: on a single server, one script call; with Redlock, one on every
    /// master at once, granted only with a majority within the lock's validity
    /// ([`redlock_attempt`](Self::redlock_attempt)).
    ///
    /// `listening`: we are subscribed to the release channel(s), and a refused attempt on
    /// a single Redis registers us as a waiter when due (see [`Waiter`]).
    async fn attempt(&mut self, listening: bool) -> Result<Attempt<T::Grant>, LockError> {
        let nodes = &self.core.nodes;
        let [node] = &nodes[..] else {
            return self.redlock_attempt().await;
        };
        let config = &self.core.config;
        let registering = listening.then(|| {
            let in_script = self.target.registers_in_script();
            self.registration
                .attempt(config.max_wait_sleep, config.request_timeout, in_script)
        });
        let waiter = registering.as_ref().map(waiter);
        self.target
            .attempt(node, &self.value, self.options.ttl(), &self.name, waiter)
            .await
    }

    /// One Redlock attempt: the target's attempt on every master at once.
    ///
    /// It decides as soon as the answers settle it (a majority granted, a majority
    /// refused, or too many failed for a majority to grant), each master's answer awaited
    /// at most [`per_master_timeout`] from the sending: a master that stops answering
    /// costs neither time nor the lock (issue 21). Granted, whatever the masters not yet
    /// read may still apply is ours, released with the lock.
    ///
    /// Refused, it cleans up where something of this attempt may be, and only there
    /// ([`clean_up`](Self::clean_up)): a master that refused wrote nothing. A master
    /// slower than the per-master timeout is not waited for: the attempt is decided
    /// without it, but its request goes on (bounded by the request timeout) and its answer
    /// is read: undone only if it granted or never answered. Not "counted as failed": an
    /// answer that is already in when the decision is read off (the drain below, after the
    /// deadline) is counted as it is, a grant too, and may make the majority. That is
    /// safe: the validity counts from `sent`, before any master could have set its key,
    /// so it never outlasts a counted grant's TTL on any master.
    async fn redlock_attempt(&mut self) -> Result<Attempt<T::Grant>, LockError> {
        let masters = self.core.nodes.len();
        let quorum = self.core.quorum;
        let ttl = self.options.ttl();
        let per_master = per_master_timeout(self.core.config.request_timeout, ttl);
        let sent = Instant::now();
        let decide_by = sent + per_master;
        let mut pending: FuturesUnordered<_> =
            (0..masters).map(|master| self.ask(master, ttl)).collect();
        let mut granted = Vec::new();
        let mut refused = Vec::new();
        let mut errors = Vec::new();
        // The masters that granted or failed: where this attempt may have set keys.
        let mut written = Vec::new();
        let mut settled = false;
        loop {
            // Once settled, the answers already in are read too (a master read is a
            // master that needs no cleanup if it refused), none awaited.
            let next = if settled {
                match pending.next().now_or_never() {
                    Some(next) => next,
                    None => break,
                }
            } else {
                match tokio::time::timeout_at(decide_by, pending.next()).await {
                    Ok(next) => next,
                    // The masters not read by now are too slow to be waited for: one
                    // timeout is counted, and the answers already in are read (the drain
                    // above, a grant counted too); the others are read by `clean_up`.
                    Err(_) => {
                        errors.push(LockError::Timeout {
                            backend: self.core.backend,
                            operation: "acquire",
                            lock: Some(self.name.to_string()),
                            after: per_master,
                        });
                        settled = true;
                        continue;
                    }
                }
            };
            let Some((master, reply)) = next else { break };
            match reply {
                Ok(Attempt::Granted(grant)) => {
                    granted.push(grant);
                    written.push(master);
                }
                Ok(Attempt::Held { remaining, .. }) => refused.push(remaining),
                Err(err) => {
                    errors.push(err);
                    written.push(master);
                }
            }
            settled |= granted.len() >= quorum
                || refused.len() >= quorum
                || errors.len() > masters - quorum;
        }
        let validity = ttl
            .saturating_sub(sent.elapsed())
            .saturating_sub(self.core.renewer.drift(ttl));
        if granted.len() >= quorum && !validity.is_zero() {
            if let Some(grant) = T::agreed(granted) {
                return Ok(Attempt::Granted(grant));
            }
            return Err(LockError::Backend {
                backend: self.core.backend,
                operation: "acquire",
                lock: Some(self.name.to_string()),
                source: "a majority granted, and no grant was counted".into(),
            });
        }
        self.clean_up(written, pending, per_master, decide_by).await;
        let remaining = refused
            .iter()
            .copied()
            .min()
            .unwrap_or(Duration::from_millis(50));
        let answered = granted.len() + refused.len();
        if answered < quorum {
            if let Some(err) = errors.into_iter().next() {
                return Err(err);
            }
        }
        Ok(Attempt::Held {
            remaining,
            registered: false,
            wake_on: None,
        })
    }

    /// The target's attempt on Redlock master `master`, within the request timeout (the
    /// attempt itself waits for it at most the per-master timeout: what comes later is
    /// read by [`clean_up`](Self::clean_up)), owning what it needs (a master not read
    /// when the attempt is decided is read in the background).
    fn ask(
        &self,
        master: usize,
        ttl: Duration,
    ) -> impl Future<Output = (usize, Result<Attempt<T::Grant>, LockError>)> + Send + 'static {
        let (core, target, value, name) = (
            self.core.clone(),
            self.target.clone(),
            self.value.clone(),
            self.name.clone(),
        );
        let span = tracing::debug_span!("acquire", node = %core.nodes[master].address);
        async move {
            let node = &core.nodes[master];
            let attempt = target.attempt(node, &value, ttl, &name, None);
            // (The connection's own response timeout bounds it too; this bounds it
            // whatever the connection does, e.g. while it reconnects.)
            let limit = core.config.request_timeout;
            let reply = tokio::time::timeout(limit, attempt)
                .await
                .unwrap_or_else(|_| {
                    // Whatever bounds the attempt first (this timer or the
                    // connection's own, both the request timeout), the connection is
                    // checked (`command_conn.rs`).
                    node.unanswered();
                    Err(LockError::Timeout {
                        backend: node.backend,
                        operation: "acquire",
                        lock: Some(name.to_string()),
                        after: limit,
                    })
                });
            (master, reply)
        }
        .instrument(span)
    }

    /// After a refused Redlock attempt: compare-and-deletes (with the attempt's owner
    /// value) on each master in `written` (it granted, or failed and may have applied the
    /// attempt), awaited within `per_master` (and finished past it), so that the next
    /// attempt does not find our own keys in its way; and on each master still `pending`
    /// once it answers, if it granted or failed (or did not answer within the request
    /// timeout), never if it refused: in the background when waiting (a stalled master
    /// must not hold up the next attempt), awaited too for a `try_lock` until
    /// `decide_by` (the per-master timeout from the sending; a master answering later is
    /// read in the background), whose caller may try again at once. A master that
    /// refused is left alone, however late its answer: it wrote nothing. (Before, a
    /// master slower than the per-master timeout counted as failed and was undone every
    /// time: k release scripts per refused attempt of k locks.)
    ///
    /// Something that may still run later with this owner value (the background, an undo
    /// not answered, a copy of an undo sent on a connection replaced as silent,
    /// `command_conn.rs`) could delete a key of the next attempt's: the next attempts then
    /// use an owner value of their own. Otherwise a confirmed undo keeps the value: should
    /// the attempt's bytes still reach that master after it (an I/O error, a reconnect,
    /// the undo confirmed on the new connection, the old bytes delivered), the key they set
    /// holds the value still in use, and that master refuses our next attempts by our own
    /// key until its TTL (docs/redis.md, Redlock). That never lets two hold the lock.
    ///
    /// Cancel safe: dropped before the owner value changes, the acquisition's own cleanup
    /// compare-and-deletes with it everywhere.
    async fn clean_up<F>(
        &mut self,
        mut written: Vec<usize>,
        mut pending: FuturesUnordered<F>,
        per_master: Duration,
        decide_by: Instant,
    ) where
        F: Future<Output = (usize, Result<Attempt<T::Grant>, LockError>)> + Send + 'static,
    {
        if !self.waits {
            // A `try_lock` answers with nothing of its own left: the masters not read yet
            // are awaited until the per-master timeout runs out, so that a caller trying
            // again at once does not meet its own keys.
            while let Ok(Some((master, reply))) =
                tokio::time::timeout_at(decide_by, pending.next()).await
            {
                if !matches!(reply, Ok(Attempt::Held { .. })) {
                    written.push(master);
                }
            }
        }
        let late = !pending.is_empty();
        if late {
            let (core, target, owner, name) = (
                self.core.clone(),
                self.target.clone(),
                self.owner.clone(),
                self.name.clone(),
            );
            tokio::spawn(async move {
                while let Some((master, reply)) = pending.next().await {
                    if matches!(reply, Ok(Attempt::Held { .. })) {
                        continue;
                    }
                    let node = &core.nodes[master];
                    if let Err(err) = target.undo_on_node(node, &owner, &name).await {
                        tracing::debug!(%err, node = %node.address, "undoing a late Redlock answer failed; TTLs will");
                    }
                }
            });
        }
        let mut undone = true;
        if !written.is_empty() {
            // A task of its own, so that an undo not answered within `per_master` (or an
            // acquisition dropped meanwhile) still finishes.
            let (core, target, owner, name) = (
                self.core.clone(),
                self.target.clone(),
                self.owner.clone(),
                self.name.clone(),
            );
            let mut undo = tokio::spawn(async move {
                let nodes = &core.nodes;
                // A copy on a replaced connection may land at any time later: the owner
                // value changes then, as for an undo not answered.
                let pinned: Vec<(Node, bool)> = written
                    .iter()
                    .map(|&master| target.undo_on_retired(&nodes[master], &owner, &name))
                    .collect();
                let copied = pinned.iter().any(|(_, copied)| *copied);
                let answers = join_all(
                    pinned
                        .iter()
                        .map(|(node, _)| target.undo_on(node, &owner, &name)),
                )
                .await;
                let mut all = !copied;
                for err in answers.into_iter().filter_map(Result::err) {
                    tracing::debug!(%err, "undoing a partial Redlock grant failed; TTLs will");
                    all = false;
                }
                all
            });
            undone = matches!(
                tokio::time::timeout(per_master, &mut undo).await,
                Ok(Ok(true))
            );
        }
        if late || !undone {
            self.new_owner();
        }
    }

    /// A fresh owner value for the next attempts, in the value written too.
    fn new_owner(&mut self) {
        self.owner = owner_value();
        set_owner(&mut self.value, &self.owner);
    }
}

/// How long a refused waiter sleeps without a message: `bound` (`max_wait_sleep`; on
/// Redlock at most [`RETRY_DELAY`]) stretched by a random 0-20 %, unless the lock in its
/// way expires (`remaining`) before that: then 80-100 % of `remaining`, so that the
/// sleep never outlasts the expiry (a lock's holder forgotten, not released: the waiter
/// tries right after it expires, not up to a fifth of its TTL later). At least 1 ms.
fn wait_sleep(remaining: Duration, bound: Duration) -> Duration {
    let longest = jittered(bound);
    let sleep = if remaining < longest {
        jittered_down(remaining)
    } else {
        longest
    };
    sleep.max(Duration::from_millis(1))
}

/// Resolves when any of `notified` does (never, for none: a waiter not subscribed).
async fn any_notified(notified: &mut [Pin<Box<Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        for n in notified.iter_mut() {
            if n.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await;
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_bounded_by_the_expiry_never_outlasts_it() {
        let second = Duration::from_secs(1);
        for _ in 0..100 {
            // The holder's expiry first: 80-100 % of it, never past it.
            let sleep = wait_sleep(5 * second, 60 * second);
            assert!(sleep >= 4 * second && sleep <= 5 * second, "{sleep:?}");
            // Between the bound and its jitter: never past it either.
            let sleep = wait_sleep(2100 * second / 1000, 2 * second);
            assert!(sleep <= 2100 * second / 1000, "{sleep:?}");
            // The bound first (a key without expiry too): 100-120 % of the bound.
            for remaining in [10 * second, Duration::MAX] {
                let sleep = wait_sleep(remaining, 2 * second);
                assert!(
                    sleep >= 2 * second && sleep <= 2400 * second / 1000,
                    "{sleep:?}"
                );
            }
            assert_eq!(wait_sleep(Duration::ZERO, second), Duration::from_millis(1));
        }
    }

    #[test]
    fn a_master_is_waited_for_at_most_a_tenth_of_the_ttl() {
        let two = Duration::from_secs(2);
        assert_eq!(
            per_master_timeout(two, Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            per_master_timeout(two, Duration::from_secs(60)),
            Duration::from_secs(2)
        );
        assert_eq!(
            per_master_timeout(two, Duration::from_secs(2)),
            Duration::from_millis(200)
        );
    }
}
