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
//!
//! A key ahead that is not a permit of the same semaphore (a mutex, a reader, a permit of
//! a semaphore with another N: see `kind.rs`) holds every permit behind it back until it is
//! gone; the waiter then watches the key right ahead of it, which changes (it is admitted
//! and touches its key, or it is deleted) before that waiter can be admitted.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::acquire::{Acquisition, Backoff, Joined, Place};
use super::call::call_retrying;
use super::kind::Kind;
use super::watch_hub::{Registration, Scope, Subscription};
use crate::{FencingToken, LockError};

/// What a waiter must watch to learn that its turn may have come.
#[derive(Debug, PartialEq, Eq)]
enum Rank {
    /// Fewer than N keys ahead, all permits of this semaphore: a permit is ours.
    Admitted,
    /// Exactly N keys ahead, all holders of this semaphore: watch every deletion under
    /// the prefix.
    First,
    /// Watch this key (the one right ahead) for any change.
    Behind(Vec<u8>),
    /// My key is gone.
    Gone,
}

impl Acquisition {
    /// Joins the queue: put my key and read the N oldest keys in the same revision (mine
    /// is the newest: if it is among them, they are everything ahead of me).
    pub(super) async fn enqueue_for_permit(
        &self,
        key: &str,
    ) -> Result<(FencingToken, Place, i64), LockError> {
        // A waiting place carries no key: the wait reads its rank first.
        let waiting = Place::Behind(Vec::new());
        let oldest = GetOptions::new()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(i64::try_from(self.kind.holders()).unwrap_or(i64::MAX));
        match self.join(key, oldest).await? {
            Joined::Now { token, read } => {
                let kvs = read.kvs();
                let complete = kvs.last().is_some_and(|kv| {
                    FencingToken::from_revision(kv.create_revision()) == Some(token)
                });
                let place = match complete.then(|| rank_of(&self.kind, token, kvs)) {
                    Some(Rank::Admitted) => Place::Head,
                    _ => waiting,
                };
                Ok((token, place, token.as_revision()))
            }
            Joined::Earlier(token) => {
                let place = match self.rank(token).await? {
                    Rank::Admitted => Place::Head,
                    Rank::Gone => Place::Gone,
                    Rank::First | Rank::Behind(_) => waiting,
                };
                Ok((token, place, 0))
            }
        }
    }

    /// Waits until a permit is ours, then touches my key so the waiter behind me knows.
    /// The first waiter takes the session's watch of the lock (any deletion may admit it);
    /// the others watch the key right ahead for any change.
    pub(super) async fn wait_for_permit(
        &self,
        token: FencingToken,
        key: &str,
        mut lock_watch: Subscription,
    ) -> Result<(), LockError> {
        let hub = &self.inner().hub;
        let mut backoff = Backoff::new();
        let mut watching: Option<(Vec<u8>, Registration)> = None;
        loop {
            // Read after the lock watch exists: a deletion after the read is delivered.
            if lock_watch.ready().await.is_none() {
                backoff.wait().await;
                lock_watch = hub.subscribe(&self.prefix);
                continue;
            }
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
                Rank::First => {
                    watching = None;
                    // Any deletion (or the end of the watch) calls for a new rank.
                    let _ = lock_watch.next_deletion().await;
                }
                Rank::Behind(ahead) => match watching.as_mut() {
                    Some((watched, watch)) if *watched == ahead && !watch.has_ended() => {
                        watch.deleted().await;
                    }
                    _ => {
                        let scope = Scope {
                            prefix: false,
                            puts: true,
                        };
                        let mut watch = hub.watch(ahead.clone(), scope);
                        // Read again once the watch exists: nothing can slip in between.
                        if watch.created().await {
                            backoff.reset();
                        } else {
                            backoff.wait().await;
                        }
                        watching = Some((ahead, watch));
                    }
                },
            }
        }
    }

    /// My rank: the keys up to mine, oldest first, with what they are.
    async fn rank(&self, token: FencingToken) -> Result<Rank, LockError> {
        let oldest_first = GetOptions::new().with_sort(SortTarget::Create, SortOrder::Ascend);
        let read = self.read_up_to(token, oldest_first).await?;
        Ok(rank_of(&self.kind, token, read.kvs()))
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
            .and_then([TxnOp::put(key, self.value.clone(), Some(put))]);
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

/// My rank from the keys up to mine (oldest first, mine last).
fn rank_of(kind: &Kind, token: FencingToken, oldest_first: &[etcd_client::KeyValue]) -> Rank {
    let Some((mine, ahead)) = oldest_first.split_last() else {
        return Rank::Gone;
    };
    if FencingToken::from_revision(mine.create_revision()) != Some(token) {
        return Rank::Gone;
    }
    if kind.admitted(ahead.iter().map(etcd_client::KeyValue::value)) {
        return Rank::Admitted;
    }
    let all_ours = ahead.iter().all(|kv| kind.shares_with(kv.value()));
    match ahead.last() {
        Some(_) if all_ours && ahead.len() == kind.holders() => Rank::First,
        Some(right_ahead) => Rank::Behind(right_ahead.key().to_vec()),
        None => Rank::Admitted,
    }
}
