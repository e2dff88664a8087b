//! Taking a Redis or Redlock lock: attempt, and while taken, wait for the release message
//! or a bounded, jittered sleep, whichever comes first.
//!
//! Cancel safety comes from the owner value rather than a task: see [`acquire`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::Instrument;

use super::core::Core;
use super::guard::RedisGuard;
use super::keys::LockKeys;
use super::node::Attempt;
use super::owner::{jittered, owner_value};
use super::subscriber::{Interest, Subscriber};
use super::value::{lock_value, set_owner};
use super::waiter::{Registration, waiter};
use crate::lease_clock::{Clock, ClockInstant};
use crate::retry::backoff;
use crate::{Backend, FencingToken, LockError, LockOptions};

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

/// Runs one acquisition. `wait`: queue up (`lock`) or not (`try_lock`).
///
/// # Cancel safety
///
/// Every attempt uses the same random owner value, and the lock can only ever hold that
/// value if one of our attempts set it. If this future is dropped (while an attempt is in
/// flight, or between attempts), a compare-and-delete with that owner value is sent in the
/// background: on each connection it queues behind the attempt, so it removes the lock if
/// the attempt set it and does nothing otherwise. No task is spawned on the way in.
pub(crate) async fn acquire(
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    name: &str,
    keys: LockKeys,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<RedisGuard>, LockError> {
    let backend = core.backend;
    let counted = std::time::Instant::now();
    let result = acquire_uncounted(core, subscriber, name, keys, options, wait).await;
    crate::metrics::acquisition(backend, name, counted, &result);
    result
}

async fn acquire_uncounted(
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    name: &str,
    keys: LockKeys,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<RedisGuard>, LockError> {
    let owner = owner_value();
    let value = lock_value(&owner, options.holder_record().as_deref());
    let mut acquisition = Acquisition {
        keys,
        core,
        subscriber,
        name: Arc::from(name),
        owner,
        value,
        options: options.clone(),
        started: Instant::now(),
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
                        .unwrap_or(LockError::WaitTimeout {
                            name: name.to_owned(),
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

struct Acquisition {
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    name: Arc<str>,
    keys: LockKeys,
    owner: Arc<str>,
    /// What the key gets: the owner value, then the holder record if any (`value.rs`).
    /// Dropped with the acquisition: the guard keeps only the owner.
    value: Vec<u8>,
    options: LockOptions,
    started: Instant,
    /// Whether dropping this must clean up after a possibly applied attempt.
    armed: bool,
    /// Our registration in the lock's waiters' set (single Redis only: Redlock waiters
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

impl Drop for Acquisition {
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
        let (core, keys, owner, name, armed) = (
            self.core.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.owner),
            std::mem::take(&mut self.name),
            self.armed,
        );
        runtime.spawn(async move {
            // The attempt may have taken any slot: compare-and-delete each.
            for slot in (0..keys.slots().len()).filter(|_| armed) {
                if let Err(err) = core.release(&keys.granted(slot), &owner, &name, None).await {
                    tracing::debug!(%err, lock = %name, "cleanup after an abandoned attempt failed; the TTL will");
                }
            }
            if let Some(waiter) = waiter {
                if let Err(err) = core.unregister(&keys, &waiter, &name).await {
                    tracing::debug!(%err, lock = %name, "unregistering a waiter that gave up failed; its registration expires");
                }
            }
        });
    }
}

impl Acquisition {
    async fn run(&mut self, wait: bool) -> Result<Option<RedisGuard>, LockError> {
        let deadline = self.options.wait_timeout().map(|t| self.started + t);
        let mut interest: Option<Interest> = None;
        loop {
            // Armed before the attempt: a release published while it runs still wakes us.
            let notify = interest.as_ref().map(Interest::notify);
            let notified = notify.as_ref().map(|n| n.notified());
            let mut notified = std::pin::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            if self.uncertain {
                // An earlier attempt failed and may have been applied: the lock may hold
                // our owner value, and we would wait out our own TTL. Undo it first.
                match self.undo().await {
                    Ok(()) => {
                        self.uncertain = false;
                        // Redlock's undo answers at a quorum and finishes in the
                        // background; one master's compare-and-delete can even run after
                        // our next SET (a reconnect, a NOSCRIPT reload): with the same
                        // owner value it would delete our fresh key. A new value per
                        // attempt after an undo makes a late undo harmless.
                        self.new_owner();
                    }
                    Err(err) => {
                        self.retry_after(err, deadline).await?;
                        continue;
                    }
                }
            }
            let sent = Clock::BOOT.now();
            // Registered only while subscribed: a release that sees the registration
            // publishes, and the subscription (armed above) hears it.
            let listening = interest.is_some();
            // The registration is counted from the sending: it reached the server later.
            let attempt_sent = Instant::now();
            let remaining = match self.attempt(listening).await {
                Ok(Attempt::Granted(token, slot)) => {
                    // A single Redis lock's token is checked against those this client
                    // saw (a semaphore's permits and Redlock's largest-of-the-masters
                    // token have no such order to check).
                    let token =
                        if self.core.backend == Backend::Redis && self.keys.slots().len() == 1 {
                            let key = self.keys.granted(slot).lock.clone();
                            self.core
                                .checked_token(&self.keys, &key, &self.owner, token, &self.name)
                                .await?
                        } else {
                            token
                        };
                    return Ok(Some(self.guard(token, slot, sent)));
                }
                Ok(Attempt::Held {
                    remaining,
                    registered,
                }) => {
                    self.failures = 0;
                    self.last_error = None;
                    if registered {
                        self.registration.registered(attempt_sent);
                    }
                    remaining
                }
                // A waiting acquisition rides out a server restart or a dropped
                // connection: it retries, with a backoff, within its wait timeout.
                Err(err) if wait && err.is_unavailable() => {
                    self.uncertain = true;
                    self.registration.unsure();
                    self.retry_after(err, deadline).await?;
                    continue;
                }
                Err(err) => return Err(err),
            };
            if !wait {
                return Ok(None);
            }
            if let (None, Some(subscriber)) = (&interest, &self.subscriber) {
                // Subscribe, then try again at once: the holder may have released
                // between our attempt and the subscription.
                interest = Some(subscriber.interest(self.keys.channel()).await);
                continue;
            }
            // Never past the holder's expiry, never longer than the configured bound; with no
            // release message to wake us (Redlock), retry at least every RETRY_DELAY.
            let bound = match &self.subscriber {
                Some(_) => self.core.config.max_wait_sleep,
                None => self.core.config.max_wait_sleep.min(RETRY_DELAY),
            };
            let sleep = jittered(remaining.min(bound).max(Duration::from_millis(1)));
            tokio::select! {
                () = async { if let Some(n) = notified.as_mut().as_pin_mut() { n.await } else { std::future::pending().await } } => {}
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

    /// Compare-and-delete of every slot with our owner value: removes what an attempt
    /// whose answer was lost may have set.
    async fn undo(&self) -> Result<(), LockError> {
        for slot in 0..self.keys.slots().len() {
            self.core
                .release(&self.keys.granted(slot), &self.owner, &self.name, None)
                .await?;
        }
        Ok(())
    }

    /// One attempt: on a single server, one script call; with Redlock, one on every
    /// master at once, granted only with a majority within the lock's validity.
    ///
    /// Redlock decides as soon as the answers settle it (a majority granted, a majority
    /// refused, or too many failed for a majority to grant), each master's answer
    /// awaited at most [`per_master_timeout`]: a master that stops answering costs
    /// neither time nor the lock (issue 21). What it may still apply later is undone in
    /// the background when the attempt is refused, and is ours anyway when granted.
    ///
    /// `listening`: we are subscribed to the release channel, and a refused attempt on a
    /// single Redis registers us as a waiter when due (see [`Waiter`]).
    async fn attempt(&mut self, listening: bool) -> Result<Attempt, LockError> {
        let ttl = self.options.ttl();
        let nodes = &self.core.nodes;
        if let [node] = &nodes[..] {
            let config = &self.core.config;
            let registering = listening.then(|| {
                let slots = self.keys.slots().len();
                self.registration
                    .attempt(config.max_wait_sleep, config.request_timeout, slots)
            });
            let waiter = registering.as_ref().map(waiter);
            return node
                .acquire(&self.keys, &self.value, ttl, &self.name, waiter)
                .await;
        }
        let backend = self.core.backend;
        let quorum = self.core.quorum;
        let per_master = per_master_timeout(self.core.config.request_timeout, ttl);
        let sent = Instant::now();
        let this: &Self = self;
        let value = &this.value;
        let mut pending: FuturesUnordered<_> = nodes
            .iter()
            .map(|node| {
                let attempt = node.acquire(&this.keys, value, ttl, &this.name, None);
                async move {
                    tokio::time::timeout(per_master, attempt)
                        .await
                        .unwrap_or_else(|_| {
                            Err(LockError::Timeout {
                                backend,
                                operation: "acquire",
                                lock: Some(this.name.to_string()),
                                after: per_master,
                            })
                        })
                }
                .instrument(tracing::debug_span!("acquire", node = %node.address))
            })
            .collect();
        let mut granted = Vec::new();
        let mut refused = Vec::new();
        let mut errors = Vec::new();
        while let Some(reply) = pending.next().await {
            match reply {
                Ok(Attempt::Granted(token, _)) => granted.push(token),
                Ok(Attempt::Held { remaining, .. }) => refused.push(remaining),
                Err(err) => errors.push(err),
            }
            if granted.len() >= quorum
                || refused.len() >= quorum
                || errors.len() > nodes.len() - quorum
            {
                break;
            }
        }
        // Requests still unanswered are dropped; one already sent may still be applied,
        // after this (on each connection, a later request queues behind it).
        let unanswered = !pending.is_empty();
        drop(pending);
        let validity = ttl
            .saturating_sub(sent.elapsed())
            .saturating_sub(self.core.renewer.drift(ttl));
        if granted.len() >= quorum && !validity.is_zero() {
            return Ok(Attempt::Granted(
                granted.into_iter().max().unwrap_or(FencingToken::new(0)),
                0,
            ));
        }
        // No majority in time: undo the partial grants, and whatever an unanswered or
        // failed request may have set (compare-and-delete, so only ours), in the
        // background: a stalled master must not hold up the next attempt.
        if !granted.is_empty() || unanswered || !errors.is_empty() {
            let (core, keys, owner, name) = (
                self.core.clone(),
                self.keys.clone(),
                self.owner.clone(),
                self.name.clone(),
            );
            tokio::spawn(async move {
                if let Err(err) = core.release(&keys, &owner, &name, None).await {
                    tracing::debug!(%err, "undoing a partial Redlock grant failed; TTLs will");
                }
            });
            // That undo may run after our next attempt's SET on some master (nothing
            // orders it before): the next attempt uses an owner value of its own.
            self.new_owner();
        }
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
        })
    }

    /// A fresh owner value for the next attempts, in the value written too.
    fn new_owner(&mut self) {
        self.owner = owner_value();
        set_owner(&mut self.value, &self.owner);
    }

    fn guard(&mut self, token: FencingToken, slot: usize, sent: ClockInstant) -> RedisGuard {
        let keys = self.keys.granted(slot);
        // A lock's holder stays registered until its release unregisters it.
        let waiter = self.registration.hand_to_guard(self.keys.slots().len());
        let registration = self.core.renewer.register(
            keys.lock.clone(),
            self.owner.clone(),
            self.options.ttl(),
            self.options.renews(),
            sent,
        );
        tracing::debug!(%token, "lock acquired");
        RedisGuard::new(
            self.core.clone(),
            self.name.clone(),
            keys,
            self.owner.clone(),
            waiter,
            token,
            registration,
        )
    }
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
