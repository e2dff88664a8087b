//! What one acquisition takes: a lock or a semaphore's permit ([`LockKeys`]), or several
//! locks at once (`lock_all.rs`). The acquisition itself (`acquire.rs`: attempts, waiting
//! on release messages, retries, cleanup) is the same for all; what differs is here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::core::Core;
use super::guard::RedisGuard;
use super::keys::LockKeys;
use super::node::{Attempt, Node, Waiter};
use crate::lease_clock::ClockInstant;
use crate::{Backend, FencingToken, LockError, LockOptions};

/// The keys one acquisition takes, and how.
pub(crate) trait Target: Clone + Send + Sync + 'static {
    /// What a granted attempt hands over.
    type Grant: Send;
    /// What the acquisition returns: the guard, or the guards.
    type Taken: Send;

    /// What the target is called in errors, logs and metrics: the lock's name, or the
    /// names joined by commas.
    fn label(&self) -> &Arc<str>;

    /// The release channels a waiter listens on: a release on any of them may let the
    /// next attempt succeed.
    fn channels(&self) -> Vec<&str>;

    /// Whether the attempt is one script that registers the waiter on every refusal and
    /// unregisters it at the grant (see `Registration::attempt`).
    fn registers_in_script(&self) -> bool;

    /// One attempt on one server, with `value` (owner and holder record) for `ttl`;
    /// `label` names the lock(s) in errors; `waiter` as `Node::acquire`'s.
    fn attempt<'a>(
        &'a self,
        node: &'a Node,
        value: &'a [u8],
        ttl: Duration,
        label: &'a str,
        waiter: Option<Waiter<'a>>,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>, LockError>> + Send + 'a;

    /// Redlock: what the grants of a majority of masters amount to (each lock's largest
    /// token); `None` for no grant at all.
    fn agreed(grants: Vec<Self::Grant>) -> Option<Self::Grant>;

    /// Compare-and-delete, with `owner`, of every key an attempt may have set on `node`
    /// (one server, one Redlock master): what an attempt whose answer was lost (or that
    /// was abandoned, or granted on too few masters) may have taken there. Tries every
    /// key; the first error, if any.
    fn undo_on<'a>(
        &'a self,
        node: &'a Node,
        owner: &'a str,
        label: &'a str,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a;

    /// Sends a copy of [`undo_on`](Self::undo_on) `node` on each of its connections
    /// replaced lately (`command_conn.rs`), in the background: an attempt sent on one of
    /// those may still reach the server after the undo on the new connection, and the
    /// copy there queues behind it. Returns `node` on the connection that was current
    /// before (the undo itself goes there), and whether it sent any copy: a copy may
    /// land at any time later, so `owner` must not be used again (it would delete a
    /// later grant's key).
    fn undo_on_retired(&self, node: &Node, owner: &str, label: &str) -> (Node, bool) {
        let (current, retired) = node.for_undo();
        let copied = !retired.is_empty();
        for retired in retired {
            let (target, owner, label) = (self.clone(), owner.to_owned(), label.to_owned());
            // Not awaited: the connection was replaced for not answering; the undo's
            // bytes are written to it at once, and go where the attempt's go.
            tokio::spawn(async move {
                if let Err(err) = target.undo_on(&retired, &owner, &label).await {
                    tracing::debug!(%err, node = %retired.address, lock = %label, "an undo on a replaced connection was not answered (it follows its attempt, if that ever arrives)");
                }
            });
        }
        (current, copied)
    }

    /// [`undo_on`](Self::undo_on) `node`, its answer awaited, and its copies on the
    /// connections replaced lately ([`undo_on_retired`](Self::undo_on_retired)). For a
    /// caller that never uses `owner` again.
    fn undo_on_node<'a>(
        &'a self,
        node: &'a Node,
        owner: &'a str,
        label: &'a str,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a {
        let (current, _) = self.undo_on_retired(node, owner, label);
        async move { self.undo_on(&current, owner, label).await }
    }

    /// [`undo_on_node`](Self::undo_on_node) every server of `core` at once, each answer
    /// awaited (each request within the request timeout); the first error, if any. For a
    /// caller that never uses `owner` again.
    fn undo<'a>(
        &'a self,
        core: &'a Core,
        owner: &'a str,
        label: &'a str,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a {
        async move {
            let undone = join_all(
                core.nodes
                    .iter()
                    .map(|node| self.undo_on_node(node, owner, label)),
            );
            undone.await.into_iter().collect()
        }
    }

    /// Removes `waiter` from every waiters' set it may be in. Tries every set; the first
    /// error, if any.
    fn unregister<'a>(
        &'a self,
        core: &'a Core,
        waiter: &'a str,
        label: &'a str,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'a;

    /// The guard(s) of `grant`.
    fn taken<'a>(
        &'a self,
        grant: Self::Grant,
        grantee: Grantee<'a>,
    ) -> impl Future<Output = Result<Self::Taken, LockError>> + Send + 'a;
}

/// Who was granted: what every guard of the grant is built from.
pub(crate) struct Grantee<'a> {
    pub(crate) core: &'a Arc<Core>,
    /// The acquisition's owner value (one for every lock it took).
    pub(crate) owner: &'a Arc<str>,
    /// The id the holder of a lock stays registered under until its release (`None`
    /// when the grant unregistered it, or it never registered).
    pub(crate) waiter: Option<Arc<str>>,
    pub(crate) options: &'a LockOptions,
    /// When the granting attempt was sent: each lease counts from then.
    pub(crate) sent: ClockInstant,
}

impl Grantee<'_> {
    /// A single Redis lock's freshly granted `token`, checked against the highest this
    /// client saw for the lock (`Core::checked_token`); as granted elsewhere (a
    /// semaphore's permits and Redlock's largest-of-the-masters token have no such order
    /// to check).
    pub(crate) async fn checked(
        &self,
        keys: &LockKeys,
        name: &str,
        token: FencingToken,
    ) -> Result<FencingToken, LockError> {
        if self.core.backend != Backend::Redis || keys.slots().len() != 1 {
            return Ok(token);
        }
        self.core
            .checked_token(keys, &keys.lock, self.owner, token, name)
            .await
    }

    /// The guard of lock `name` (`keys`, the slot taken), holding `token`; renewed by the
    /// client's renewal task from now on.
    pub(crate) fn guard(
        &self,
        name: Arc<str>,
        keys: LockKeys,
        waiter: Option<Arc<str>>,
        token: FencingToken,
    ) -> RedisGuard {
        let registration = self.core.renewer.register(
            keys.lock.clone(),
            self.owner.clone(),
            self.options.ttl(),
            self.options.renews(),
            self.sent,
        );
        tracing::debug!(lock = %name, %token, "lock acquired");
        RedisGuard::new(
            self.core.clone(),
            name,
            keys,
            self.owner.clone(),
            waiter,
            token,
            registration,
        )
    }
}

/// A lock (one slot) or a semaphore (a slot of several): `ACQUIRE`, or the lock's
/// pipeline (`Node::acquire`).
#[derive(Clone)]
pub(crate) struct One {
    pub(crate) name: Arc<str>,
    pub(crate) keys: LockKeys,
}

impl One {
    /// Lock `name` of `core`'s client.
    pub(crate) fn new(core: &Core, name: &str) -> Self {
        Self {
            name: Arc::from(name),
            keys: core.keys(name),
        }
    }
}

impl Target for One {
    type Grant = (FencingToken, usize);
    type Taken = RedisGuard;

    fn label(&self) -> &Arc<str> {
        &self.name
    }

    fn channels(&self) -> Vec<&str> {
        vec![self.keys.channel()]
    }

    fn registers_in_script(&self) -> bool {
        self.keys.slots().len() > 1
    }

    fn attempt<'a>(
        &'a self,
        node: &'a Node,
        value: &'a [u8],
        ttl: Duration,
        label: &'a str,
        waiter: Option<Waiter<'a>>,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>, LockError>> + Send + 'a {
        node.acquire(&self.keys, value, ttl, label, waiter)
    }

    fn agreed(grants: Vec<Self::Grant>) -> Option<Self::Grant> {
        // Redlock has one slot.
        grants
            .into_iter()
            .map(|(token, _)| token)
            .max()
            .map(|t| (t, 0))
    }

    async fn undo_on(&self, node: &Node, owner: &str, label: &str) -> Result<(), LockError> {
        // The attempt may have taken any slot: compare-and-delete each.
        let mut first = Ok(());
        for slot in 0..self.keys.slots().len() {
            let keys = self.keys.granted(slot);
            if let Err(err) = node.release(&keys, owner, label, None).await {
                first = first.and(Err(err));
            }
        }
        first
    }

    async fn unregister(&self, core: &Core, waiter: &str, label: &str) -> Result<(), LockError> {
        core.unregister(&self.keys, waiter, label).await
    }

    async fn taken(
        &self,
        (token, slot): Self::Grant,
        grantee: Grantee<'_>,
    ) -> Result<RedisGuard, LockError> {
        let keys = self.keys.granted(slot);
        let token = grantee.checked(&keys, &self.name, token).await?;
        let waiter = grantee.waiter.clone();
        Ok(grantee.guard(self.name.clone(), keys, waiter, token))
    }
}
