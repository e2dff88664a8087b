//! One request about one lock key (a join or a delete): what it asks of etcd, what etcd
//! answered, and how it goes out alone or as a member of a batch's transaction
//! (`batch.rs` decides which, and keeps each member's outcome its own).

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, GetOptions, KvClient, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Duration;

use super::call::{Attempts, call_retrying_noting};
use super::keys::LockPath;
use super::token_renewal::TokenRenewal;
use crate::{Backend, LockError};

/// One request about one lock key.
#[derive(Debug)]
pub(super) enum Request {
    /// Put `key` holding `value` under `lease` if it does not exist, and read the lock's
    /// prefix with `read` in the same revision; if it exists, read it back.
    Join {
        path: LockPath,
        key: Arc<str>,
        value: Vec<u8>,
        lease: i64,
        read: GetOptions,
    },
    /// Delete exactly `key`.
    Delete { path: LockPath, key: Arc<str> },
}

/// What etcd answered for one request.
#[derive(Debug)]
pub(super) enum Answer {
    /// Whether the join put its key, the answers to its own operations (the put and the
    /// prefix read, or the read of the existing key), and the store revision right after
    /// the transaction that carried it (its key's create revision if it put the key).
    Join {
        succeeded: bool,
        responses: Vec<TxnOpResponse>,
        revision: Option<i64>,
    },
    /// How many keys the delete removed, and the store revision its answer was read at
    /// (at or after the delete's own).
    Delete { deleted: i64, revision: Option<i64> },
}

/// One request's outcome: its answer or error, and whether some attempt of it got no
/// answer (see [`Attempts`]).
pub(super) type Sent = Attempts<Answer>;

impl Request {
    pub(super) fn name(&self) -> &str {
        match self {
            Self::Join { path, .. } | Self::Delete { path, .. } => path.name(),
        }
    }

    pub(super) fn prefix(&self) -> &str {
        match self {
            Self::Join { path, .. } | Self::Delete { path, .. } => path.prefix(),
        }
    }

    pub(super) fn operation(&self) -> &'static str {
        match self {
            Self::Join { .. } => "acquire",
            Self::Delete { .. } => "release",
        }
    }

    /// The join's transaction; see `key_life.rs` for why it is guarded.
    fn join_txn(key: &str, value: &[u8], lease: i64, prefix: &str, read: &GetOptions) -> Txn {
        let put = PutOptions::new().with_lease(lease);
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value.to_vec(), Some(put)),
                TxnOp::get(prefix, Some(read.clone().with_prefix())),
            ])
            .or_else([TxnOp::get(key, None)])
    }

    /// Bytes this request adds to a batch, roughly: its keys and value.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Self::Join {
                path, key, value, ..
            } => path.prefix().len() + key.len() * 2 + value.len() + 64,
            Self::Delete { key, .. } => key.len() * 2 + 32,
        }
    }

    /// Operations this request adds to a batch's success branch: 2 for a join, 1 for a
    /// release (what counts against the server's `--max-txn-ops`).
    pub(super) fn ops(&self) -> usize {
        match self {
            Self::Join { .. } => 2,
            Self::Delete { .. } => 1,
        }
    }

    /// Adds this request to a batch: its compare, its operations in the success branch and
    /// in the failure branch.
    pub(super) fn add_to(
        &self,
        compares: &mut Vec<Compare>,
        then: &mut Vec<TxnOp>,
        otherwise: &mut Vec<TxnOp>,
    ) {
        match self {
            Self::Join {
                path,
                key,
                value,
                lease,
                read,
            } => {
                compares.push(Compare::create_revision(&**key, CompareOp::Equal, 0));
                let put = PutOptions::new().with_lease(*lease);
                then.push(TxnOp::put(&**key, value.clone(), Some(put)));
                then.push(TxnOp::get(
                    &**path.prefix(),
                    Some(read.clone().with_prefix()),
                ));
                otherwise.push(TxnOp::get(&**key, None));
            }
            Self::Delete { key, .. } => {
                then.push(TxnOp::delete(&**key, None));
                otherwise.push(TxnOp::delete(&**key, None));
            }
        }
    }

    /// Sends the request on its own (retried as [`call_retrying_noting`] does).
    pub(super) async fn send_alone(
        &self,
        kv: &KvClient,
        renewal: &TokenRenewal,
        timeout: Duration,
    ) -> Sent {
        match self {
            Self::Join {
                path,
                key,
                value,
                lease,
                read,
            } => {
                let prefix = path.prefix();
                // Built once for the first attempt and again for a retry, not cloned per
                // attempt: a deep clone of every key and option, on every join.
                let mut first = Some(Self::join_txn(key, value, *lease, prefix, read));
                let Attempts { result, ambiguous } =
                    call_retrying_noting("acquire", Some(path.name()), timeout, renewal, || {
                        let mut kv = kv.clone();
                        let txn = first
                            .take()
                            .unwrap_or_else(|| Self::join_txn(key, value, *lease, prefix, read));
                        async move { kv.txn(txn).await }
                    })
                    .await;
                let result = result.map(|txn| {
                    let revision = txn.header().map(|h| h.revision());
                    Answer::Join {
                        succeeded: txn.succeeded(),
                        responses: txn.op_responses(),
                        revision,
                    }
                });
                Attempts { result, ambiguous }
            }
            Self::Delete { path, key } => {
                let Attempts { result, ambiguous } =
                    call_retrying_noting("release", Some(path.name()), timeout, renewal, || {
                        let mut kv = kv.clone();
                        async move { kv.delete(&**key, None).await }
                    })
                    .await;
                let result = result.map(|response| Answer::Delete {
                    deleted: response.deleted(),
                    revision: response.header().map(|h| h.revision()),
                });
                Attempts { result, ambiguous }
            }
        }
    }
}

pub(super) fn malformed_member(request: &Request) -> LockError {
    super::call::malformed(
        request.operation(),
        Some(request.name()),
        "batch answer does not match its request",
    )
}

/// The batch's error, for one member: the same kind and text (callers branch on both:
/// [`may_have_applied`] reads the text), named after the member's operation and lock; a
/// timeout states the member's own time spent, `waited` (queued, then in the batch).
pub(super) fn copy_error(err: &LockError, request: &Request, waited: Duration) -> LockError {
    let operation = request.operation();
    let lock = Some(request.name().to_owned());
    match err {
        LockError::Timeout { .. } => LockError::Timeout {
            backend: Backend::Etcd,
            operation,
            lock,
            after: waited,
        },
        LockError::Unavailable { source, .. } => LockError::Unavailable {
            backend: Backend::Etcd,
            operation,
            lock,
            source: source.to_string().into(),
        },
        LockError::PermissionDenied { message, .. } => LockError::PermissionDenied {
            backend: Backend::Etcd,
            operation,
            lock,
            message: message.clone(),
        },
        LockError::Backend { source, .. } => LockError::Backend {
            backend: Backend::Etcd,
            operation,
            lock,
            source: source.to_string().into(),
        },
        other => LockError::Backend {
            backend: Backend::Etcd,
            operation,
            lock,
            source: other.to_string().into(),
        },
    }
}
