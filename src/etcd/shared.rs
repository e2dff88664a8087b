//! The reader's side of a read-write lock: admitted when no writer is ahead.
//!
//! Every key of a read-write lock holds its side (`read` or `write`). A writer queues
//! exactly like a mutex waiter (any key ahead holds it back). A reader only waits for the
//! nearest *writer* ahead of it, watching that key's deletion; readers ahead of it do not
//! hold it back. Since a writer waits for everyone ahead, and readers queue behind a
//! waiting writer, writers do not starve.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::acquire::{Acquisition, Backoff, Place};
use super::call::{call_retrying, malformed};
use crate::{FencingToken, LockError};

/// The value of a writer's key.
pub(crate) const WRITE: &[u8] = b"write";
/// The value of a reader's key.
pub(crate) const READ: &[u8] = b"read";

impl Acquisition {
    /// Joins the queue as a reader: put my key and learn my place in one transaction
    /// (my key is the newest, so every key read is ahead of me or mine).
    pub(super) async fn enqueue_shared(
        &self,
        key: &str,
    ) -> Result<(FencingToken, Place), LockError> {
        let inner = self.inner();
        let put = PutOptions::new().with_lease(inner.lease_id());
        let everyone = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, self.value.clone(), Some(put)),
                TxnOp::get(self.prefix.as_str(), Some(everyone)),
            ])
            .or_else([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let name = Some(self.name.as_str());
        let response = call_retrying("acquire", name, inner.config.request_timeout, || {
            let mut client = inner.kv.clone();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await?;
        let responses = response.op_responses();
        if !response.succeeded() {
            // An earlier attempt got through: read where we stand.
            let token = match responses.first() {
                Some(etcd_client::TxnOpResponse::Get(mine)) => mine
                    .kvs()
                    .first()
                    .and_then(|kv| FencingToken::from_revision(kv.create_revision())),
                _ => None,
            }
            .ok_or_else(|| malformed("acquire", name, "existing key without revision"))?;
            return Ok((token, self.reader_place(token).await?));
        }
        let token = response
            .header()
            .and_then(|h| FencingToken::from_revision(h.revision()))
            .ok_or_else(|| malformed("acquire", name, "missing header revision"))?;
        let Some(etcd_client::TxnOpResponse::Get(range)) = responses.get(1) else {
            return Err(malformed("acquire", name, "missing range result"));
        };
        Ok((token, place_of_reader(token, range.kvs())))
    }

    /// Waits until no writer is ahead, watching the nearest one each time.
    pub(super) async fn wait_shared(&self, token: FencingToken) -> Result<(), LockError> {
        let hub = &self.inner().hub;
        let mut backoff = Backoff::new();
        let mut watch = None;
        loop {
            let place = match self.reader_place(token).await {
                Ok(place) => place,
                Err(err) if err.is_unavailable() => {
                    backoff.wait().await;
                    continue;
                }
                Err(err) => return Err(err),
            };
            match place {
                Place::Head => return Ok(()),
                Place::Gone => return Err(self.lost_while_waiting()),
                Place::Behind(writer) => {
                    let current: Option<&mut super::watch_hub::Registration> = watch.as_mut();
                    match current {
                        Some(w) if w.key() == writer.as_slice() && !w.has_ended() => {
                            w.deleted().await;
                        }
                        _ => {
                            let mut fresh = hub.watch_deletion(writer);
                            // Read again once the watch exists: nothing can slip between.
                            if fresh.created().await {
                                backoff.reset();
                            } else {
                                backoff.wait().await;
                            }
                            watch = Some(fresh);
                        }
                    }
                }
            }
        }
    }

    /// Reads the keys up to mine and finds the nearest writer ahead, if any.
    async fn reader_place(&self, token: FencingToken) -> Result<Place, LockError> {
        let inner = self.inner();
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(token.as_revision())
            .with_sort(SortTarget::Create, SortOrder::Descend);
        let response = call_retrying(
            "wait",
            Some(&self.name),
            inner.config.request_timeout,
            || {
                let mut client = inner.kv.clone();
                let options = options.clone();
                async move { client.get(self.prefix.as_str(), Some(options)).await }
            },
        )
        .await?;
        Ok(place_of_reader(token, response.kvs()))
    }
}

/// A reader's place from keys sorted newest first, none newer than mine.
fn place_of_reader(token: FencingToken, newest_first: &[etcd_client::KeyValue]) -> Place {
    let mine = newest_first
        .first()
        .is_some_and(|kv| FencingToken::from_revision(kv.create_revision()) == Some(token));
    if !mine {
        return Place::Gone;
    }
    match newest_first.iter().skip(1).find(|kv| kv.value() == WRITE) {
        Some(writer) => Place::Behind(writer.key().to_vec()),
        None => Place::Head,
    }
}
