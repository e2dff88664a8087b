//! What a Redis client and its guards share: the nodes, the quorum, the renewal task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tracing::Instrument;

use super::RedisConfig;
use super::config::shown;
use super::distinct_masters::refuse_one_server_twice;
use super::keys::LockKeys;
use super::node::Node;
use super::renewer::Renewer;
use crate::{Backend, FencingToken, LockError};

pub(crate) struct Core {
    pub(crate) backend: Backend,
    pub(crate) nodes: Arc<[Node]>,
    /// How many nodes must agree: 1 for a single Redis, a majority for Redlock.
    pub(crate) quorum: usize,
    pub(crate) renewer: Renewer,
    pub(crate) config: RedisConfig,
    /// The highest token granted to this client per token counter (single Redis locks),
    /// to notice a counter that went backwards.
    seen: Mutex<HashMap<String, FencingToken>>,
}

/// How many counters [`Core::seen`] remembers before it starts afresh (a bound on memory
/// for a client that locks many distinct names).
const SEEN_LIMIT: usize = 65_536;

impl Core {
    pub(crate) async fn connect(config: RedisConfig, backend: Backend) -> Result<Self, LockError> {
        config.validate(backend)?;
        let connecting = config
            .urls
            .iter()
            .map(|url| Node::connect(url, &config, backend));
        let nodes: Vec<Node> = join_all(connecting)
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        let shown: Vec<String> = config.urls.iter().map(|url| shown(url)).collect();
        // Bounded like reaching the servers: a master that stops answering here fails
        // the connect rather than passing unchecked.
        let check = refuse_one_server_twice(&nodes, &shown, &config.prefix, backend);
        tokio::time::timeout(config.connect_timeout, check)
            .await
            .map_err(|_| LockError::Timeout {
                backend,
                operation: "check that the masters are distinct",
                lock: None,
                after: config.connect_timeout,
            })??;
        let nodes: Arc<[Node]> = nodes.into();
        let quorum = nodes.len() / 2 + 1;
        let renewer = Renewer::start(
            backend,
            nodes.clone(),
            quorum,
            config.clock_drift_factor,
            config.request_timeout,
        );
        Ok(Self {
            backend,
            nodes,
            quorum,
            renewer,
            config,
            seen: Mutex::default(),
        })
    }

    /// Checks a single Redis lock's freshly granted `token` against the highest this
    /// client saw for that lock. A token not above it means the counter went backwards
    /// (evicted, flushed, a failover): reported (`tracing::warn!`, the
    /// `fencelock_token_regressions_total` metric), and the counter is moved forward,
    /// which gives this grant a token above every earlier one, if the lock (`key`) still
    /// holds `owner` when that runs; if not, the grant was lost meanwhile and this says so
    /// (a newer token must not go to a lost grant, above the live holder's).
    pub(crate) async fn checked_token(
        &self,
        keys: &LockKeys,
        key: &str,
        owner: &str,
        token: FencingToken,
        name: &str,
    ) -> Result<FencingToken, LockError> {
        // One look-up on the common path (the token went up, or a first grant): the map
        // is hashed once per grant, under one lock.
        let (last, node) = {
            let mut seen = self.seen();
            match (seen.get_mut(keys.counter()), &self.nodes[..]) {
                // Went backwards on a single server: moved forward below.
                (Some(last), [node]) if token <= *last => (*last, node),
                // Went up (or Redlock's largest of the masters: no order to check).
                (Some(last), _) => {
                    *last = (*last).max(token);
                    return Ok(token);
                }
                (None, _) => {
                    if seen.len() >= SEEN_LIMIT {
                        seen.clear();
                    }
                    // The name is copied only the first time this client sees the counter.
                    seen.insert(keys.counter().to_owned(), token);
                    return Ok(token);
                }
            }
        };
        tracing::warn!(
            lock = name,
            %token,
            %last,
            "the token counter went backwards (evicted or flushed?); moving it forward"
        );
        crate::metrics::token_regression(self.backend);
        // Boxed: the script call's future would otherwise enlarge every grant's, on a
        // path taken only after a counter was lost.
        let token = Box::pin(node.advance_counter(keys.counter(), key, owner, last, name))
            .await?
            .ok_or_else(|| LockError::LeaseLost {
                lock: Some(name.to_owned()),
                reason: crate::LossReason::Expired,
            })?;
        let mut seen = self.seen();
        let entry = seen.entry(keys.counter().to_owned()).or_insert(token);
        *entry = (*entry).max(token);
        Ok(token)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, FencingToken>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(&self.config.prefix, name)
    }

    /// Removes `waiter` from the lock's waiters' set (single Redis: Redlock waiters never
    /// register). Best effort for a waiter that gave up: the registration expires anyway.
    pub(crate) async fn unregister(
        &self,
        keys: &LockKeys,
        waiter: &str,
        name: &str,
    ) -> Result<(), LockError> {
        match &self.nodes[..] {
            [node] => node.unregister(keys, waiter, name).await,
            _ => Ok(()),
        }
    }

    /// Compare-and-delete on every node. `waiter`: the id the holder waited under on a
    /// single Redis (unregistered with the release; Redlock waiters never register).
    /// `Ok(true)` if a quorum still held it for us,
    /// `Ok(false)` if a quorum answered and it was not ours, an error if too few answered.
    ///
    /// Redlock decides as soon as the answers settle it: a master that stops answering
    /// does not hold up the release; its compare-and-delete runs on in the background
    /// (bounded by the request timeout), and its copy of the lock expires anyway.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        name: &str,
        waiter: Option<&str>,
    ) -> Result<bool, LockError> {
        if let [node] = &self.nodes[..] {
            return node.release(keys, owner, name, waiter).await;
        }
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| {
                let (node, keys, owner, name) = (
                    node.clone(),
                    keys.clone(),
                    owner.to_owned(),
                    name.to_owned(),
                );
                let span = tracing::debug_span!("release", node = %node.address);
                tokio::spawn(
                    async move { node.release(&keys, &owner, &name, None).await }.instrument(span),
                )
            })
            .collect();
        let (mut deleted, mut kept) = (0, 0);
        let mut errors = Vec::new();
        while let Some(reply) = pending.next().await {
            match reply {
                Ok(Ok(true)) => deleted += 1,
                Ok(Ok(false)) => kept += 1,
                Ok(Err(err)) => errors.push(err),
                Err(join) => errors.push(LockError::Backend {
                    backend: self.backend,
                    operation: "release",
                    lock: Some(name.to_owned()),
                    source: Box::new(join),
                }),
            }
            let answered = deleted + kept;
            if deleted >= self.quorum
                || (answered >= self.quorum && kept > self.nodes.len() - self.quorum)
            {
                break;
            }
        }
        // Dropping the handles leaves the unanswered releases running in the background.
        drop(pending);
        if deleted >= self.quorum {
            return Ok(true);
        }
        if deleted + kept >= self.quorum {
            return Ok(false);
        }
        match errors.into_iter().next() {
            Some(err) => Err(err),
            None => Ok(false),
        }
    }
}
