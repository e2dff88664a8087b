//! What a Redis client and its guards share: the nodes, the quorum, the renewal task.

use std::sync::Arc;

use futures_util::future::join_all;

use super::RedisConfig;
use super::keys::LockKeys;
use super::node::Node;
use super::renewer::Renewer;
use crate::{Backend, LockError};

pub(crate) struct Core {
    pub(crate) backend: Backend,
    pub(crate) nodes: Arc<[Node]>,
    /// How many nodes must agree: 1 for a single Redis, a majority for Redlock.
    pub(crate) quorum: usize,
    pub(crate) renewer: Renewer,
    pub(crate) config: RedisConfig,
}

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
        })
    }

    pub(crate) fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(&self.config.prefix, name)
    }

    /// Compare-and-delete on every node. `Ok(true)` if a quorum still held it for us,
    /// `Ok(false)` if a quorum answered and it was not ours, an error if too few answered.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        name: &str,
    ) -> Result<bool, LockError> {
        let replies = join_all(self.nodes.iter().map(|n| n.release(keys, owner, name))).await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        let deleted = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        if deleted >= self.quorum {
            return Ok(true);
        }
        if answered >= self.quorum {
            return Ok(false);
        }
        match replies.into_iter().find_map(Result::err) {
            Some(err) => Err(err),
            None => Ok(false),
        }
    }
}
