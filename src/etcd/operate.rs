//! For operators and token-checking services: is a token current, and breaking a holder.
//! Nothing here is on the lock's own path: one range read of the lock's prefix decides
//! who holds, by the same rules a waiter uses (`kind.rs`).

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};

use super::call::{call_renewing, call_retrying};
use super::kind::Kind;
use super::locker::EtcdLocker;
use crate::{BreakOutcome, FencingToken, LockError, TokenCheck, validate_name};

impl EtcdLocker {
    /// Whether `token` holds lock `name` now: one range read of the lock's prefix, whose
    /// keys in create-revision order say who is admitted (Go's `etcdctl lock` keys
    /// included).
    ///
    /// A check is a moment: see [`TokenCheck`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn check(&self, name: &str, token: FencingToken) -> Result<TokenCheck, LockError> {
        validate_name(name)?;
        let holders = self.holding(name).await?;
        Ok(if holders.iter().any(|(t, _)| *t == token) {
            TokenCheck::Current
        } else if let Some((first, _)) = holders.first() {
            TokenCheck::Superseded { by: *first }
        } else {
            TokenCheck::Free
        })
    }

    /// Ends the holder of lock `name` whose token is `token`: deletes its key in a
    /// transaction guarded by the key's create revision (the token), so that a holder
    /// granted in between is never touched, whatever its key's name. The broken
    /// holder's guard reports the loss ([`LossReason::KeyDeleted`](crate::LossReason::KeyDeleted))
    /// within one watch delivery, and the next waiter is granted with a larger token, so
    /// fenced storage refuses the broken holder's late writes. (Its lease lives on: other
    /// locks of that session are not touched.) A Go `etcdctl lock` holder broken this
    /// way is not told: only fencing stops it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the delete is one transaction, applied or not. It is sent once: an
    /// attempt whose answer is lost reports the error, and [`check`](Self::check) says
    /// what became of it.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn break_holder(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<BreakOutcome, LockError> {
        validate_name(name)?;
        let holders = self.holding(name).await?;
        let Some((_, key)) = holders.iter().find(|(t, _)| *t == token) else {
            return Ok(BreakOutcome::NotHolding {
                holder: holders.first().map(|(t, _)| *t),
            });
        };
        let revision = i64::try_from(token.get()).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let timeout = self.config().request_timeout;
        let answer = call_renewing("break", Some(name), timeout, self.renewal(), || {
            let mut kv = super::answers::kv(self.client());
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await?;
        if answer.succeeded() {
            return Ok(BreakOutcome::Broken);
        }
        // Gone since the read (released, expired, broken): nothing was deleted.
        let holders = self.holding(name).await?;
        Ok(BreakOutcome::NotHolding {
            holder: holders.first().map(|(t, _)| *t),
        })
    }

    /// Ends every holder and waiter of lock `name`, whichever client made them: one
    /// delete of the lock's prefix. Returns how many keys it deleted. Each fencelock
    /// guard and waiter of them learns it (`LossReason::KeyDeleted`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one request, applied or not.
    #[tracing::instrument(skip(self), fields(backend = "etcd"))]
    pub async fn break_all(&self, name: &str) -> Result<usize, LockError> {
        validate_name(name)?;
        let prefix = super::keys::lock_prefix(&self.config().namespace, name);
        let timeout = self.config().request_timeout;
        let deleted = call_renewing("break", Some(name), timeout, self.renewal(), || {
            let mut kv = super::answers::kv(self.client());
            let delete = etcd_client::DeleteOptions::new().with_prefix();
            let prefix = prefix.clone();
            async move { kv.delete(prefix, Some(delete)).await }
        })
        .await?;
        Ok(usize::try_from(deleted.deleted()).unwrap_or(usize::MAX))
    }

    /// The tokens and keys that hold lock `name` now, first admitted first.
    async fn holding(&self, name: &str) -> Result<Vec<(FencingToken, Vec<u8>)>, LockError> {
        let prefix = super::keys::lock_prefix(&self.config().namespace, name);
        let client = self.client();
        let timeout = self.config().request_timeout;
        let response = call_retrying("check", Some(name), timeout, self.renewal(), || {
            let mut kv = super::answers::kv(client);
            let prefix = prefix.clone();
            async move {
                kv.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await
            }
        })
        .await?;
        let kvs: &[KeyValue] = response.kvs();
        let mut holders = Vec::new();
        for (i, kv) in kvs.iter().enumerate() {
            let kind = Kind::from_value(kv.value());
            if !kind.admitted(kvs[..i].iter().map(KeyValue::value)) {
                continue;
            }
            if let Some(token) = FencingToken::from_revision(kv.create_revision()) {
                holders.push((token, kv.key().to_vec()));
            }
        }
        Ok(holders)
    }
}
