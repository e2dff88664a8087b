//! For operators and token-checking services: is a token current, and breaking a holder.

use zookeeper_client::Error as ZkError;

use super::ZooKeeperLocker;
use super::contender::Contender;
use super::error::RequestError;
use super::inspect::queue_of;
use super::session::Session;
use crate::{
    Backend, BreakOutcome, FencingToken, LockError, LockOptions, TokenCheck, validate_name,
};

/// A node that holds the lock now.
struct Holding {
    path: String,
    token: FencingToken,
    /// Its data version, which the delete of a break is guarded by.
    version: i32,
}

impl ZooKeeperLocker {
    /// Whether `token` holds lock `name` now: its node is first in line (or a reader with
    /// no exclusive node ahead). One listing and a stat of each holder.
    ///
    /// A check is a moment: see [`TokenCheck`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn check(&self, name: &str, token: FencingToken) -> Result<TokenCheck, LockError> {
        validate_name(name)?;
        let session = self.session_for(&LockOptions::new()).await?;
        let holders = self.holders(&session, name).await?;
        Ok(if holders.iter().any(|h| h.token == token) {
            TokenCheck::Current
        } else if let Some(first) = holders.first() {
            TokenCheck::Superseded { by: first.token }
        } else {
            TokenCheck::Free
        })
    }

    /// Ends the holder of lock `name` whose token is `token`: deletes exactly its node
    /// (found by its czxid, deleted with the version it was read at), so that a holder
    /// granted in between is never touched. Its guard reports the loss
    /// ([`LossReason::KeyDeleted`](crate::LossReason::KeyDeleted)) within one watch
    /// delivery, and the next waiter is granted with a larger token, so fenced storage
    /// refuses the broken holder's late writes. A kazoo or Curator holder broken this way
    /// is not told (their recipes do not watch their own node): only fencing stops it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the delete is one request, applied or not.
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn break_holder(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<BreakOutcome, LockError> {
        validate_name(name)?;
        let fail = |err: RequestError| err.into_lock_error("break", Some(name));
        let session = self.session_for(&LockOptions::new()).await?;
        let holders = self.holders(&session, name).await?;
        let Some(target) = holders.iter().find(|h| h.token == token) else {
            return Ok(BreakOutcome::NotHolding {
                holder: holders.first().map(|h| h.token),
            });
        };
        let (path, version) = (target.path.clone(), target.version);
        let deleted = session
            .call(|client| async move { client.delete(&path, Some(version)).await })
            .await;
        match deleted {
            Ok(()) => Ok(BreakOutcome::Broken),
            // Gone (released, expired) or changed since it was read: not ours to break.
            Err(RequestError::Server(ZkError::NoNode | ZkError::BadVersion)) => {
                let holders = self.holders(&session, name).await?;
                Ok(BreakOutcome::NotHolding {
                    holder: holders.first().map(|h| h.token),
                })
            }
            Err(err) => Err(fail(err)),
        }
    }

    /// Ends every holder and waiter of lock `name`, whichever client made them: deletes
    /// every contender's node. Returns how many were deleted. Each fencelock guard and
    /// waiter of them learns it (`LossReason::KeyDeleted`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each delete is one request; a dropped call leaves the rest.
    #[tracing::instrument(skip(self), fields(backend = "zookeeper"))]
    pub async fn break_all(&self, name: &str) -> Result<usize, LockError> {
        validate_name(name)?;
        let fail = |err: RequestError| err.into_lock_error("break", Some(name));
        let session = self.session_for(&LockOptions::new()).await?;
        let dir = format!("{}/{name}", self.config().namespace);
        let mut deleted = 0;
        for contender in self.contenders(&session, name).await? {
            let path = format!("{dir}/{}", contender.name);
            match session
                .call(|client| async move { client.delete(&path, None).await })
                .await
            {
                Ok(()) => deleted += 1,
                Err(RequestError::Server(ZkError::NoNode)) => {}
                Err(err) => return Err(fail(err)),
            }
        }
        Ok(deleted)
    }

    /// The contenders of lock `name`, in queue order.
    async fn contenders(&self, session: &Session, name: &str) -> Result<Vec<Contender>, LockError> {
        let dir = format!("{}/{name}", self.config().namespace);
        queue_of(session, &dir)
            .await
            .map_err(|err| err.into_lock_error("check", Some(name)))?
            .map_err(|recipe| LockError::IncompatibleRecipe {
                backend: Backend::ZooKeeper,
                lock: name.to_owned(),
                recipe: recipe.describe(),
            })
    }

    /// The nodes that hold lock `name` now: the first in line, and the readers right
    /// after a reader at the head. A holder gone between the listing and its stat makes
    /// the listing be read again.
    async fn holders(&self, session: &Session, name: &str) -> Result<Vec<Holding>, LockError> {
        let dir = format!("{}/{name}", self.config().namespace);
        'listing: loop {
            let mut holders = Vec::new();
            for contender in self.contenders(session, name).await? {
                let reader = contender.kind.shares_with_readers();
                let holds = holders.is_empty() || (reader && holders_all_read(&holders));
                if !holds {
                    break;
                }
                let path = format!("{dir}/{}", contender.name);
                let stat = {
                    let path = path.clone();
                    session
                        .call(|client| async move { client.check_stat(&path).await })
                        .await
                        .map_err(|err| err.into_lock_error("check", Some(name)))?
                };
                let Some(stat) = stat else { continue 'listing };
                holders.push((
                    reader,
                    Holding {
                        path,
                        token: FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0)),
                        version: stat.version,
                    },
                ));
            }
            return Ok(holders.into_iter().map(|(_, holding)| holding).collect());
        }
    }
}

/// Whether every holder so far is a reader (a reader behind them shares the lock).
fn holders_all_read(holders: &[(bool, Holding)]) -> bool {
    holders.iter().all(|(reader, _)| *reader)
}
