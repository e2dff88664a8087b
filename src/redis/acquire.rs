//! Taking a Redis or Redlock lock (a semaphore's permit, several locks at once: what is
//! taken is a [`Target`]): attempt, and while taken, wait for a release message (on any
//! of the target's channels) or a bounded, jittered sleep, whichever comes first.
//!
//! Cancel safety comes from the owner value rather than a task: see [`acquire`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use tracing::Instrument;

use super::core::Core;
use super::node::Attempt;
use super::owner::{jittered, owner_value};
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
/// Every attempt uses the same random owner value, and a lock key can only ever hold that
/// value if one of our attempts set it. If this future is dropped (while an attempt is in
/// flight, or between attempts), a compare-and-delete with that owner value of every key
/// the target may have taken is sent in the background: on each connection it queues
/// behind the attempt, so it removes a key if the attempt set it and does nothing
/// otherwise. No task is spawned on the way in.
pub(crate) async fn acquire<T: Target>(
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
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
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    target: T,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<T::Taken>, LockError> {
    let owner = owner_value();
    let value = lock_value(&owner, options.holder_record().as_deref());
    let mut acquisition = Acquisition {
        name: target.label().clone(),
        target,
        core,
        subscriber,
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

struct Acquisition<T: Target> {
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    /// The lock's name (several locks: their names joined by commas).
    name: Arc<str>,
    target: T,
    owner: Arc<str>,
    /// What the key gets: the owner value, then the holder record if any (`value.rs`).
    /// Dropped with the acquisition: the guard keeps only the owner.
    value: Vec<u8>,
    options: LockOptions,
    started: Instant,
    /// Whether dropping this must clean up after a possibly applied attempt.
    armed: bool,
    /// Our registration in the lock's waiters' set (several locks: in the set of each
    /// lock an attempt found held; single Redis only: Redlock waiters poll and never
    /// register).
    registration: Registration,
    /// Whether a failed attempt may have set the lock with our owner value (undone
    /// before the next attempt).
    uncertain: bool,
    /// Failed requests in a row, for the backoff.
    failures: u32,
    /// The last request error, while no later attempt got an answer.
    last_error: Option<LockError>,
}

impl<T: Target> Drop for Acquisition<T> {
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

impl<T: Target> Acquisition<T> {
    async fn run(&mut self, wait: bool) -> Result<Option<T::Taken>, LockError> {
        let deadline = self.options.wait_timeout().map(|t| self.started + t);
        // One per release channel of the target, once subscribed (none before).
        let mut interests: Vec<Interest> = Vec::new();
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
            let listening = !interests.is_empty();
            // The registration is counted from the sending: it reached the server later.
            let attempt_sent = Instant::now();
            let remaining = match self.attempt(listening).await {
                Ok(Attempt::Granted(grant)) => {
                    // A lock's holder stays registered until its release unregisters it;
                    // a grant in one script unregistered it already.
                    let in_script = self.target.registers_in_script();
                    let grantee = Grantee {
                        core: &self.core,
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
            if let (true, Some(subscriber)) = (interests.is_empty(), &self.subscriber) {
                // Subscribe (to every lock's channel), then try again at once: a holder
                // may have released between our attempt and the subscription.
                for channel in self.target.channels() {
                    interests.push(subscriber.interest(channel).await);
                }
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
        self.target.undo(&self.core, &self.owner, &self.name).await
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
    /// `listening`: we are subscribed to the release channel(s), and a refused attempt on
    /// a single Redis registers us as a waiter when due (see [`Waiter`]).
    async fn attempt(&mut self, listening: bool) -> Result<Attempt<T::Grant>, LockError> {
        let ttl = self.options.ttl();
        let nodes = &self.core.nodes;
        if let [node] = &nodes[..] {
            let config = &self.core.config;
            let registering = listening.then(|| {
                let in_script = self.target.registers_in_script();
                self.registration
                    .attempt(config.max_wait_sleep, config.request_timeout, in_script)
            });
            let waiter = registering.as_ref().map(waiter);
            return self
                .target
                .attempt(node, &self.value, ttl, &self.name, waiter)
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
                let attempt = this.target.attempt(node, value, ttl, &this.name, None);
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
                Ok(Attempt::Granted(grant)) => granted.push(grant),
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
            if let Some(grant) = T::agreed(granted) {
                return Ok(Attempt::Granted(grant));
            }
            return Err(LockError::Backend {
                backend,
                operation: "acquire",
                lock: Some(self.name.to_string()),
                source: "a majority granted, and no grant was counted".into(),
            });
        }
        // No majority in time: undo the partial grants, and whatever an unanswered or
        // failed request may have set (compare-and-delete, so only ours), in the
        // background: a stalled master must not hold up the next attempt.
        if !granted.is_empty() || unanswered || !errors.is_empty() {
            let (core, target, owner, name) = (
                self.core.clone(),
                self.target.clone(),
                self.owner.clone(),
                self.name.clone(),
            );
            tokio::spawn(async move {
                if let Err(err) = target.undo(&core, &owner, &name).await {
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
