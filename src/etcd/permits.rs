//! Waiting for one of N permits: the semaphore's queue discipline.
//!
//! Holders are the N keys with the lowest create revisions under the prefix. A waiter is
//! admitted when fewer than N keys are ahead of it. Watching the key N places ahead does
//! not work (a holder in the middle may leave first), and watching every key ahead is a
//! herd, so:
//!
//! - the *first* waiter (exactly N keys ahead: all holders) watches the whole prefix for
//!   deletions; it is the only one that does;
//! - every other waiter watches the key right ahead of it for any change;
//! - a waiter that is admitted *touches* its key (a guarded put that keeps the create
//!   revision, so its token does not change): the waiter behind it wakes up, finds itself
//!   first, and starts watching the prefix.
//!
//! Each event wakes at most two waiters, and FIFO order by create revision is kept.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::acquire::{Acquisition, Backoff, Joined, Place};
use super::call::call_retrying;
use super::watch_hub::{Registration, Scope};
use crate::{FencingToken, LockError};

/// What a waiter must watch to learn that its turn may have come.
#[derive(Debug, PartialEq, Eq)]
enum Rank {
    /// Fewer than N keys ahead: a permit is ours.
    Admitted,
    /// All N keys ahead are holders: watch every deletion under the prefix.
    First,
    /// Watch this key (the one right ahead) for any change.
    Behind(Vec<u8>),
    /// My key is gone.
    Gone,
}

impl Acquisition {
    /// Joins the queue: put my key and count the semaphore's keys in the same revision
    /// (mine is the newest, so the count is my rank plus one).
    pub(super) async fn enqueue_for_permit(
        &self,
        key: &str,
    ) -> Result<(FencingToken, Place), LockError> {
        // A waiting place carries no key: the wait reads its rank first.
        let waiting = Place::Behind(Vec::new());
        match self.join(key, GetOptions::new().with_count_only()).await? {
            Joined::Now { token, read } => {
                let keys = usize::try_from(read.count()).unwrap_or(usize::MAX);
                Ok((
                    token,
                    if keys <= self.permits {
                        Place::Head
                    } else {
                        waiting
                    },
                ))
            }
            Joined::Earlier(token) => {
                let place = match self.rank(token).await? {
                    Rank::Admitted => Place::Head,
                    Rank::Gone => Place::Gone,
                    Rank::First | Rank::Behind(_) => waiting,
                };
                Ok((token, place))
            }
        }
    }

    /// Waits until a permit is ours, then touches my key so the waiter behind me knows.
    pub(super) async fn wait_for_permit(
        &self,
        token: FencingToken,
        key: &str,
    ) -> Result<(), LockError> {
        let hub = &self.inner().hub;
        let mut backoff = Backoff::new();
        let mut watching: Option<(Rank, Registration)> = None;
        loop {
            let rank = match self.rank(token).await {
                Ok(rank) => rank,
                Err(err) if err.is_unavailable() => {
                    backoff.wait().await;
                    continue;
                }
                Err(err) => return Err(err),
            };
            match rank {
                Rank::Admitted => return self.touch(key, token).await,
                Rank::Gone => return Err(self.lost_while_waiting()),
                target => {
                    let reuse = matches!(&watching, Some((current, watch)) if *current == target && !watch.has_ended());
                    if reuse {
                        if let Some((_, watch)) = watching.as_mut() {
                            watch.deleted().await;
                        }
                    } else {
                        let scope = match &target {
                            Rank::First => Scope {
                                prefix: true,
                                puts: false,
                            },
                            _ => Scope {
                                prefix: false,
                                puts: true,
                            },
                        };
                        let watched = match &target {
                            Rank::Behind(ahead) => ahead.clone(),
                            _ => self.prefix.clone().into_bytes(),
                        };
                        let mut watch = hub.watch(watched, scope);
                        // Read again once the watch exists: nothing can slip in between.
                        if watch.created().await {
                            backoff.reset();
                        } else {
                            backoff.wait().await;
                        }
                        watching = Some((target, watch));
                    }
                }
            }
        }
    }

    /// My rank: the keys up to mine, oldest first.
    async fn rank(&self, token: FencingToken) -> Result<Rank, LockError> {
        let oldest_first = GetOptions::new()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let read = self.read_up_to(token, oldest_first).await?;
        let kvs = read.kvs();
        let mine = kvs
            .last()
            .is_some_and(|kv| FencingToken::from_revision(kv.create_revision()) == Some(token));
        let ahead = kvs.len().saturating_sub(1);
        Ok(match (mine, ahead) {
            (false, _) => Rank::Gone,
            (true, n) if n < self.permits => Rank::Admitted,
            (true, n) if n == self.permits => Rank::First,
            (true, n) => Rank::Behind(kvs[n - 1].key().to_vec()),
        })
    }

    /// A write to my key that keeps its create revision (so the token stands), made only
    /// while the key is still mine: it wakes the waiter watching me.
    async fn touch(&self, key: &str, token: FencingToken) -> Result<(), LockError> {
        let inner = self.inner();
        let put = PutOptions::new().with_lease(inner.lease_id());
        let txn = Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                token.as_revision(),
            )])
            .and_then([TxnOp::put(key, "admitted", Some(put))]);
        let response = call_retrying(
            "acquire",
            Some(&self.name),
            inner.config.request_timeout,
            || {
                let mut client = inner.kv.clone();
                let txn = txn.clone();
                async move { client.txn(txn).await }
            },
        )
        .await?;
        if response.succeeded() {
            Ok(())
        } else {
            Err(self.lost_while_waiting())
        }
    }
}
