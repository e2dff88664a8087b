//! Taking a Redis or Redlock lock: attempt, and while taken, wait for the release message
//! or a bounded, jittered sleep, whichever comes first.
//!
//! Like the etcd backend, each acquisition runs in a task of its own: if the caller drops
//! its future, the task finishes the attempt in flight and releases anything it got.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use super::core::Core;
use super::guard::RedisGuard;
use super::keys::LockKeys;
use super::node::Attempt;
use super::owner::{jittered, owner_value};
use super::subscriber::{Interest, Subscriber};
use crate::{FencingToken, LockError, LockOptions};

/// How often a waiter without release messages (Redlock) retries at most: the usual
/// Redlock client behaviour of a short random delay between attempts.
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// Runs one acquisition in its own task. `wait`: queue up (`lock`) or not (`try_lock`).
pub(crate) async fn acquire(
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    name: &str,
    options: &LockOptions,
    wait: bool,
) -> Result<Option<RedisGuard>, LockError> {
    let (reply, answer) = oneshot::channel();
    let task = Acquisition {
        keys: core.keys(name),
        core,
        subscriber,
        name: name.to_owned(),
        owner: owner_value(),
        options: options.clone(),
        started: Instant::now(),
    };
    tokio::spawn(task.run(wait, reply).instrument(tracing::Span::current()));
    answer.await.unwrap_or_else(|_| {
        Err(LockError::Backend {
            backend: crate::Backend::Redis,
            operation: "acquire",
            lock: Some(name.to_owned()),
            source: "the acquisition task stopped (runtime shutting down?)".into(),
        })
    })
}

type Reply = oneshot::Sender<Result<Option<RedisGuard>, LockError>>;

struct Acquisition {
    core: Arc<Core>,
    subscriber: Option<Arc<Subscriber>>,
    name: String,
    keys: LockKeys,
    owner: String,
    options: LockOptions,
    started: Instant,
}

impl Acquisition {
    async fn run(self, wait: bool, mut reply: Reply) {
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
            let sent = Instant::now();
            let remaining = match self.attempt().await {
                Err(err) => {
                    let _ = reply.send(Err(err));
                    return;
                }
                Ok(Attempt::Granted(token)) => {
                    let guard = self.into_guard(token, sent);
                    // If the caller is gone, the guard comes back and its drop releases.
                    let _ = reply.send(Ok(Some(guard)));
                    return;
                }
                Ok(Attempt::Held { remaining }) => remaining,
            };
            if !wait {
                let _ = reply.send(Ok(None));
                return;
            }
            if let (None, Some(subscriber)) = (&interest, &self.subscriber) {
                // Subscribe, then try again at once: the holder may have released
                // between our attempt and the subscription.
                interest = Some(subscriber.interest(&self.keys.channel).await);
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
                () = sleep_until_opt(deadline) => {
                    let _ = reply.send(Err(LockError::WaitTimeout {
                        name: self.name.clone(),
                        waited: self.options.wait_timeout().unwrap_or_default(),
                    }));
                    return;
                }
                () = reply.closed() => return,
            }
        }
    }

    /// One attempt: on a single server, one script call; with Redlock, one on every
    /// master at once, granted only with a majority within the lock's validity.
    async fn attempt(&self) -> Result<Attempt, LockError> {
        let ttl = self.options.ttl();
        let nodes = &self.core.nodes;
        if let [node] = &nodes[..] {
            return node.acquire(&self.keys, &self.owner, ttl, &self.name).await;
        }
        let sent = Instant::now();
        let replies = join_all(
            nodes
                .iter()
                .map(|n| n.acquire(&self.keys, &self.owner, ttl, &self.name)),
        )
        .await;
        let granted: Vec<FencingToken> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Attempt::Granted(token)) => Some(*token),
                _ => None,
            })
            .collect();
        let validity = ttl
            .saturating_sub(sent.elapsed())
            .saturating_sub(self.core.renewer.drift(ttl));
        if granted.len() >= self.core.quorum && !validity.is_zero() {
            return Ok(Attempt::Granted(
                granted.into_iter().max().unwrap_or(FencingToken::new(0)),
            ));
        }
        // No majority in time: undo the partial grants (compare-and-delete, so only ours).
        if !granted.is_empty() {
            if let Err(err) = self.core.release(&self.keys, &self.owner, &self.name).await {
                tracing::debug!(%err, "undoing a partial Redlock grant failed; TTLs will");
            }
        }
        let remaining = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Attempt::Held { remaining }) => Some(*remaining),
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_millis(50));
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.core.quorum {
            if let Some(err) = replies.into_iter().find_map(Result::err) {
                return Err(err);
            }
        }
        Ok(Attempt::Held { remaining })
    }

    fn into_guard(self, token: FencingToken, sent: Instant) -> RedisGuard {
        let registration = self.core.renewer.register(
            self.keys.lock.clone(),
            self.owner.clone(),
            self.options.ttl(),
            self.options.renews(),
            sent,
        );
        tracing::debug!(%token, "lock acquired");
        RedisGuard::new(
            self.core,
            self.name,
            self.keys,
            self.owner,
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
