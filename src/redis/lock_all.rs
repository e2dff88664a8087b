//! Several Redis locks taken together, **all or none, in one script** (`scripts.rs`,
//! `LOCK_ALL`), for `RedisLocker`'s and `RedlockLocker`'s `lock_all`.
//!
//! # What one attempt does
//!
//! One script call looks at every lock key; if every one is free it takes them all with
//! one owner value (`SET NX PX`, and `INCR` of each lock's own token counter), otherwise
//! it writes nothing and registers the waiter in the waiters' set of ONE lock it found
//! held, the one that expires last, in that same step. So an attempt never holds some of
//! the locks, and a release of that lock after the refusal sees the registration and
//! publishes.
//!
//! # Waiting
//!
//! As one lock's wait (`acquire.rs`): the first refusal subscribes to every lock's release
//! channel (at once) and tries again at once; after that, each refusal sleeps until a
//! release message on the channel of the lock it registered with, or a bounded, jittered
//! sleep (never past that lock's expiry: a sleep the expiry bounds is jittered downward),
//! whichever comes first. It holds **nothing** while it waits.
//!
//! Why one registration loses no wake-up: no attempt can be granted while the lock
//! registered with is held. It stops being held by its release, which sees the
//! registration and publishes (the waiter, subscribed before it tried, hears it), or by
//! its expiry, which the sleep does not outlast (a renewal only makes the waiter try
//! early), or by someone deleting the key outright (then, as for one lock, the bounded
//! sleep). Woken while another lock is still held, the next refusal registers with that
//! one, in the same step as it finds it held, and leaves the first lock's set. Registering
//! with every held lock, as before, made every release of any of them publish and wake
//! the waiter for an attempt of the whole set that could not succeed while the others
//! were held: a set with one lock held long and others busy was woken by every cycle of
//! the busy ones.
//!
//! # Why it cannot deadlock
//!
//! A deadlock is a cycle of takers, each holding a lock the next one waits for. A taker
//! of this kind holds nothing while it waits, so it is in no cycle; a single-name lock
//! holds one lock and waits for nothing while it holds it; takers one by one in name order
//! (the trait's default elsewhere, or an older fencelock) hold only locks before the one
//! they wait for in one global order, and so form no cycle among themselves. Any mix of
//! the three on the same names is deadlock-free. (Nested single locks taken in no fixed
//! order can still deadlock with each other, as anywhere.)
//!
//! # Not fair
//!
//! A waiter is granted only at an attempt that finds every one of its locks free at
//! once; under steady contention on its names a large set may wait long, or until its wait
//! timeout (single-name takers of any of its locks can keep overtaking it).
//!
//! # Tokens
//!
//! Each lock's token comes from its own counter, as for a single lock: the locks of one
//! grant carry different tokens (unlike etcd's and ZooKeeper's, which share one
//! revision). On a single Redis each is larger than every earlier grant's of the same
//! lock (as far as the counter survives: see docs/redis.md on failover and eviction).
//! Not on Redlock: each lock's token is the largest of the granting masters' counters,
//! which promises no order (docs/redis.md's table).
//!
//! # Redlock
//!
//! The same script on every master: granted when a majority of masters took every lock
//! within the validity (TTL minus the time the attempt took minus drift), each lock's
//! token the largest of those masters'; otherwise every lock is compare-and-deleted on
//! each master that granted or failed (awaited within the per-master timeout) or had not
//! answered yet (once it answers, if it granted or never answered), never on one that
//! refused, however late, as for one lock (`acquire.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::acquire::acquire;
use super::core::Core;
use super::guard::RedisGuard;
use super::keys::LockKeys;
use super::locker::MIN_TTL;
use super::node::{Attempt, Node, Waiter, malformed, millis, remaining};
use super::script_call::ScriptCall;
use super::scripts;
use super::subscriber::Subscriber;
use super::target::{Grantee, Target};
use crate::name::distinct_names;
use crate::{FencingToken, LockError, LockOptions, MultiGuard};

/// The most locks one Redis (or Redlock) `lock_all` takes: its script looks at every key
/// and, when granted, writes two keys and reads a waiters' set per lock, and the server
/// runs nothing else meanwhile (about a thousand commands for this many).
pub const MAX_LOCK_ALL: usize = 256;

/// Takes every lock of `names` on `core`'s servers together (each name once, in any
/// order given; 1 to [`MAX_LOCK_ALL`]); `subscriber` wakes a waiter on release messages
/// (single Redis; Redlock waiters poll). `wait`: until all are free (`lock_all`), or
/// `Ok(None)` unless all are free now (`try_lock_all`).
///
/// # Cancel safety
///
/// Cancel safe, as one lock's acquisition (`acquire`): a dropped call compare-and-deletes
/// every lock with its owner value in the background, and leaves every waiters' set.
pub(crate) async fn take_all(
    core: &Arc<Core>,
    subscriber: Option<&Arc<Subscriber>>,
    names: &[&str],
    options: &LockOptions,
    wait: bool,
) -> Result<Option<MultiGuard<RedisGuard>>, LockError> {
    let names = distinct_names(names, MAX_LOCK_ALL)?;
    options.validate(MIN_TTL)?;
    let set = LockSet::new(core, &names);
    let label = set.label.to_string();
    let taken = acquire(core, subscriber, set, options, wait).await?;
    Ok(taken.map(|guards| MultiGuard::new(guards, label)))
}

/// Every lock of one `lock_all`, in name order: each name and its keys.
#[derive(Clone)]
pub(crate) struct LockSet {
    locks: Arc<[(Arc<str>, LockKeys)]>,
    /// The names joined by commas.
    label: Arc<str>,
}

impl LockSet {
    /// The locks `names` (checked, sorted, distinct) of `core`'s client.
    pub(crate) fn new(core: &Core, names: &[String]) -> Self {
        Self {
            locks: names
                .iter()
                .map(|name| (Arc::from(name.as_str()), core.keys(name)))
                .collect(),
            label: Arc::from(names.join(",")),
        }
    }

    /// `op` on every lock at once (requests on one connection are pipelined): the first
    /// error, once every one is answered.
    async fn each<'a, F, Fut>(&'a self, op: F) -> Result<(), LockError>
    where
        F: Fn(&'a str, &'a LockKeys) -> Fut,
        Fut: Future<Output = Result<(), LockError>>,
    {
        let answers = join_all(self.locks.iter().map(|(name, keys)| op(name, keys))).await;
        answers.into_iter().collect()
    }
}

impl Target for LockSet {
    /// Each lock's token, in name order.
    type Grant = Vec<FencingToken>;
    type Taken = Vec<RedisGuard>;

    fn label(&self) -> &Arc<str> {
        &self.label
    }

    fn channels(&self) -> Vec<&str> {
        self.locks.iter().map(|(_, keys)| keys.channel()).collect()
    }

    fn registers_in_script(&self) -> bool {
        true
    }

    async fn attempt(
        &self,
        node: &Node,
        value: &[u8],
        ttl: Duration,
        label: &str,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Attempt<Vec<FencingToken>>, LockError> {
        let names: Vec<&str> = self
            .locks
            .iter()
            .flat_map(|(_, keys)| [&*keys.lock, keys.counter(), keys.waiters()])
            .collect();
        let mut call = ScriptCall::new(&scripts::LOCK_ALL, &names, 5);
        let (id, lease, previous) = waiter.map_or(("", 0, 0), |w| {
            // (The script counts locks from 1; 0: none.)
            let previous = w.previous.map_or(0, |lock| lock + 1);
            (w.id, millis(w.lease), previous)
        });
        call.arg(value)
            .arg(millis(ttl))
            .arg(id)
            .arg(lease)
            .arg(previous);
        let mut conn = node.connection();
        let reply: Vec<i64> = node
            .call("acquire", Some(label), call.invoke(&mut conn))
            .await?;
        match reply.split_first() {
            Some((1, tokens)) if tokens.len() == self.locks.len() => tokens
                .iter()
                .map(|token| u64::try_from(*token).map(FencingToken::new))
                .collect::<Result<_, _>>()
                .map(Attempt::Granted)
                .map_err(|_| malformed(node.backend, "acquire", label)),
            Some((0, [pttl, on])) => Ok(Attempt::Held {
                remaining: remaining(*pttl),
                registered: waiter.is_some(),
                wake_on: usize::try_from(*on)
                    .ok()
                    .and_then(|on| on.checked_sub(1))
                    .filter(|&on| waiter.is_some() && on < self.locks.len()),
            }),
            _ => Err(malformed(node.backend, "acquire", label)),
        }
    }

    fn agreed(grants: Vec<Vec<FencingToken>>) -> Option<Vec<FencingToken>> {
        grants.into_iter().reduce(|mut largest, grant| {
            for (token, other) in largest.iter_mut().zip(grant) {
                *token = (*token).max(other);
            }
            largest
        })
    }

    async fn undo_on(&self, node: &Node, owner: &str, _label: &str) -> Result<(), LockError> {
        self.each(|name, keys| async move { node.release(keys, owner, name, None).await.map(drop) })
            .await
    }

    async fn unregister(&self, core: &Core, waiter: &str, _label: &str) -> Result<(), LockError> {
        self.each(|name, keys| core.unregister(keys, waiter, name))
            .await
    }

    async fn taken(
        &self,
        tokens: Vec<FencingToken>,
        grantee: Grantee<'_>,
    ) -> Result<Vec<RedisGuard>, LockError> {
        // Every token checked before any guard exists: a failed check leaves no guard to
        // renew (the acquisition's cleanup releases every lock).
        let mut checked = Vec::with_capacity(tokens.len());
        for ((name, keys), token) in self.locks.iter().zip(tokens) {
            checked.push(grantee.checked(keys, name, token).await?);
        }
        Ok(self
            .locks
            .iter()
            .zip(checked)
            .map(|((name, keys), token)| grantee.guard(name.clone(), keys.clone(), None, token))
            .collect())
    }
}
