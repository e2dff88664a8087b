//! Several locks at once: one `multi` creates a node in every lock's queue, in one
//! transaction with one zxid, so the acquisition stands in every queue at one point of
//! ZooKeeper's single order of writes. Then it waits in each queue in turn.
//!
//! # Why no two such acquisitions deadlock
//!
//! In each queue, contenders are ordered by when their node was created, and every node
//! of one acquisition was created by the same transaction. So of two acquisitions that
//! share locks, the one whose `multi` the leader committed first is ahead of the other
//! in *every* queue they share: a waiter only ever waits for acquisitions committed
//! before its own. Waiting follows the commit order, which has no cycle. A single-name
//! lock (fencelock's, kazoo's, Curator's) is a transaction of one node and takes its
//! place in the same order. An acquisition granted in a queue stays granted there (the
//! order never reverses), so waiting in one queue after another ends once each is won.
//!
//! The token: the nodes of one `multi` share its zxid as their `czxid`, so every lock of
//! the acquisition carries the same token, larger than every earlier grant's of each.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult};

use super::acquire::{CREATE_ATTEMPTS, Entry, czxid, find_patiently};
use super::error::{RequestError, timed};
use super::guard::ZooKeeperGuard;
use super::node::{Mark, NodeRef, protected_id};
use super::session::Session;
use super::turn::{Listing, Turn, await_turn};
use crate::{FencingToken, LockError, LockGuard, LossReason, ReleaseOutcome};

/// The most locks one acquisition takes: one `multi` carries them all, and the server
/// refuses a request above its `jute.maxbuffer` (1 MiB by default; a create is a few
/// hundred bytes with its holder record).
pub const MAX_LOCK_ALL: usize = 256;

/// Several locks held together ([`ZooKeeperLocker::lock_all`](super::ZooKeeperLocker::lock_all)):
/// one node in each lock's queue, created in one transaction.
///
/// As a [`LockGuard`] its [`token`](LockGuard::token) is the one the locks share, its
/// [`name`](LockGuard::name) the names joined by commas, and it is lost as soon as any
/// one of its locks is ([`lost_which`](Self::lost_which) says which).
#[must_use = "dropping the guard releases the locks at once"]
#[derive(Debug)]
pub struct ZooKeeperMultiGuard {
    guards: Vec<ZooKeeperGuard>,
    names: String,
    token: FencingToken,
}

impl ZooKeeperMultiGuard {
    /// Each lock's name and token (all the same token: one transaction created them).
    #[must_use]
    pub fn tokens(&self) -> Vec<(&str, FencingToken)> {
        self.guards.iter().map(|g| (g.name(), g.token())).collect()
    }

    /// The guard of each lock, in name order.
    pub fn guards(&self) -> &[ZooKeeperGuard] {
        &self.guards
    }

    /// The same locks as the generic [`MultiGuard`](crate::MultiGuard) (its token is
    /// the smallest of its locks', here the one they share).
    pub fn into_multi(self) -> crate::MultiGuard<ZooKeeperGuard> {
        crate::MultiGuard::new(self.guards, self.names)
    }

    /// Resolves when any of the locks may be gone: its name, and why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost_which(&self) -> (String, LossReason) {
        crate::multi::first_lost(&self.guards).await
    }
}

impl LockGuard for ZooKeeperMultiGuard {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn name(&self) -> &str {
        &self.names
    }

    async fn lost(&self) -> LossReason {
        self.lost_which().await.1
    }

    fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    fn lease_remaining(&self) -> Option<Duration> {
        self.guards
            .iter()
            .filter_map(LockGuard::lease_remaining)
            .min()
    }

    /// Releases every lock, each delete sent at once (one round trip for all); `Released`
    /// only if every one of them was still held.
    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        crate::multi::release_all(self.guards).await
    }
}

/// Joins the queues of `names` (sorted, distinct) in `session` with one `multi`, then
/// waits (`wait`) in each in turn, or leaves them all if one is not free.
///
/// # Cancel safety
///
/// Cancel safe: an armed entry per node removes it if this future is dropped, found by
/// the acquisition's protected id if the `multi`'s answer never came.
pub(crate) async fn acquire_all(
    session: Arc<Session>,
    namespace: &str,
    names: &[String],
    wait: bool,
    holder: &[u8],
) -> Result<Option<ZooKeeperMultiGuard>, LockError> {
    let id = protected_id();
    let mut entries: Vec<Entry> = names
        .iter()
        .map(|name| Entry {
            session: session.clone(),
            node: NodeRef {
                dir: format!("{namespace}/{name}"),
                id: id.clone(),
                path: None,
                ambiguous: false,
            },
            armed: true,
        })
        .collect();
    let label = names.join(",");
    let (token, listings) = join_all(&session, &mut entries, holder)
        .await
        .map_err(|err| err.into_lock_error("acquire", Some(&label)))?;
    for ((name, entry), listed) in names.iter().zip(&entries).zip(listings) {
        let turn = await_turn(&session, name, &entry.node, Mark::Lock, wait, listed).await?;
        if turn == Turn::Behind {
            for entry in &mut entries {
                if entry.node.remove(&session).await.is_ok() {
                    entry.armed = false;
                }
            }
            return Ok(None);
        }
    }
    let guards = names
        .iter()
        .zip(&mut entries)
        .map(|(name, entry)| {
            entry.armed = false;
            let path = entry.node.path.clone().unwrap_or_default();
            ZooKeeperGuard::new(
                session.clone(),
                name.clone(),
                entry.node.clone(),
                path,
                token,
            )
        })
        .collect();
    Ok(Some(ZooKeeperMultiGuard {
        guards,
        names: label,
        token,
    }))
}

/// Creates a node in every entry's queue in one `multi` (the missing locks' nodes first),
/// with each queue as it stood right after it when the answer came. Returns the shared
/// czxid. Protected mode as a single create's (`acquire.rs`): a `multi` whose outcome
/// is unknown is looked for by the id (it is all or nothing: the first queue tells), and
/// retires the session.
async fn join_all(
    session: &Session,
    entries: &mut [Entry],
    holder: &[u8],
) -> Result<(FencingToken, Vec<Option<Listing>>), RequestError> {
    let prefixes: Vec<String> = entries
        .iter()
        .map(|e| format!("{}/{}{}", e.node.dir, e.node.id, Mark::Lock.as_str()))
        .collect();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let client = session.client()?;
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut multi = client.new_multi_writer();
        for prefix in &prefixes {
            multi.add_create(prefix, holder, &options)?;
        }
        // The `multi` and the listings go out now, in this order, on one session: each
        // listing sees the nodes. One round trip for all.
        let created = timed_multi(session.request_timeout, multi.commit());
        let listings: Vec<_> = entries
            .iter()
            .map(|e| timed(session.request_timeout, client.get_children(&e.node.dir)))
            .collect();
        let created = created.await;
        let mut listed = Vec::with_capacity(listings.len());
        for listing in listings {
            listed.push(
                listing
                    .await
                    .ok()
                    .map(|(children, parent)| (children, parent.cversion)),
            );
        }
        match created {
            Ok(results) => {
                let mut token = None;
                for (entry, result) in entries.iter_mut().zip(results) {
                    let MultiWriteResult::Create { path, stat } = result else {
                        return Err(RequestError::Server(ZkError::UnexpectedError(
                            "a multi of creates answered something else".into(),
                        )));
                    };
                    // ZOOKEEPER-4026: a create in a multi may be answered without its stat.
                    let zxid = if stat.czxid > 0 {
                        stat.czxid
                    } else {
                        stat_of(session, &path).await?
                    };
                    token.get_or_insert(czxid(zxid)?);
                    entry.node.path = Some(path);
                }
                let token = token.ok_or_else(|| {
                    RequestError::Server(ZkError::UnexpectedError("an empty multi".into()))
                })?;
                return Ok((token, listed));
            }
            Err((Some(index), RequestError::Server(ZkError::NoNode)))
                if attempts < CREATE_ATTEMPTS =>
            {
                let dir = entries[index].node.dir.clone();
                let mkdir = session
                    .call(|client| async move {
                        let options = CreateMode::Container.with_acls(Acls::anyone_all());
                        client.mkdir(&dir, &options).await
                    })
                    .await;
                match mkdir {
                    Ok(()) | Err(RequestError::Server(ZkError::NodeExists)) => {}
                    Err(err) => return Err(err),
                }
            }
            Err((_, err)) if err.outcome_unknown() => {
                for entry in entries.iter_mut() {
                    entry.node.ambiguous = true;
                }
                session.retire();
                if attempts >= CREATE_ATTEMPTS {
                    return Err(err);
                }
                if find_patiently(session, &entries[0].node).await?.is_some() {
                    // Applied: every node exists (a multi is all or nothing).
                    let mut token = None;
                    for entry in entries.iter_mut() {
                        let Some(path) = find_patiently(session, &entry.node).await? else {
                            return Err(RequestError::Server(ZkError::NoNode));
                        };
                        token.get_or_insert(czxid(stat_of(session, &path).await?)?);
                        entry.node.path = Some(path);
                    }
                    let token = token.ok_or(RequestError::Server(ZkError::NoNode))?;
                    return Ok((token, vec![None; entries.len()]));
                }
            }
            Err((_, err)) => return Err(err),
        }
    }
}

/// The `multi`'s answer within `timeout`; an error with the index of the operation that
/// failed, if one did.
async fn timed_multi(
    timeout: Duration,
    commit: impl Future<Output = Result<Vec<MultiWriteResult>, MultiWriteError>>,
) -> Result<Vec<MultiWriteResult>, (Option<usize>, RequestError)> {
    match tokio::time::timeout(timeout, commit).await {
        Ok(Ok(results)) => Ok(results),
        Ok(Err(MultiWriteError::OperationFailed { index, source })) => {
            Err((Some(index), RequestError::Server(source)))
        }
        Ok(Err(MultiWriteError::RequestFailed { source })) => {
            Err((None, RequestError::Server(source)))
        }
        Err(_) => Err((None, RequestError::Timeout(timeout))),
    }
}

/// The czxid of the node at `path`.
async fn stat_of(session: &Session, path: &str) -> Result<i64, RequestError> {
    let path = path.to_owned();
    session
        .call(|client| async move { client.check_stat(&path).await })
        .await?
        .map(|stat| stat.czxid)
        .ok_or(RequestError::Server(ZkError::NoNode))
}
