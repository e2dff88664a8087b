//! Loss of ownership: why a lease is gone, and the signal that tells every guard.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;

use crate::Backend;
use crate::metrics::{self, Holding};

/// Why a lock's lease (and so its ownership) is considered gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal was confirmed before the lease's time ran out (a partition, a paused
    /// process, a server that stopped answering). Counted conservatively from the moment the
    /// last confirmed renewal was *sent*, so the server's lease ends no earlier than this.
    Expired,
    /// The server reports that the lease no longer exists (revoked, or expired on its side).
    Revoked,
    /// The session was closed by this client.
    Closed,
    /// The connection that held the lock closed (PostgreSQL advisory locks live exactly
    /// as long as their connection).
    Disconnected,
    /// The lock's key was deleted while its lease lived (an operator's delete, a prefix
    /// delete, a request of another client): the lease is fine, but the lock may already
    /// be someone else's (etcd).
    KeyDeleted,
    /// The client can no longer see its key's deletion (its watch task stopped, as after
    /// a panic in it): the lock is given up rather than held unobserved (etcd).
    Unwatched,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "the lease ran out before a renewal was confirmed",
            Self::Revoked => "the server reports the lease is gone",
            Self::Closed => "the session was closed",
            Self::Disconnected => "the connection that held the lock closed",
            Self::KeyDeleted => "the lock's key was deleted while its lease lived",
            Self::Unwatched => "the client's watch of the lock's key stopped",
        })
    }
}

/// The sending half: marks the loss once, for every receiver at once.
#[derive(Debug)]
pub(crate) struct LossNotifier {
    tx: watch::Sender<Option<LossReason>>,
    backend: Backend,
    /// Guards holding a lock on this lease now: what a loss costs (`metrics.rs`).
    holders: Arc<AtomicUsize>,
}

/// The receiving half, cloned into every guard.
#[derive(Clone, Debug)]
pub(crate) struct LossWatch {
    rx: watch::Receiver<Option<LossReason>>,
    backend: Backend,
    holders: Arc<AtomicUsize>,
}

/// A loss signal for one lease of `backend` (or one connection).
pub(crate) fn loss_channel(backend: Backend) -> (LossNotifier, LossWatch) {
    let (tx, rx) = watch::channel(None);
    let holders = Arc::new(AtomicUsize::new(0));
    (
        LossNotifier {
            tx,
            backend,
            holders: holders.clone(),
        },
        LossWatch {
            rx,
            backend,
            holders,
        },
    )
}

impl LossNotifier {
    /// Records the loss; the first reason wins and later ones are ignored. The first
    /// counts every lock held on the lease as lost (`fencelock_losses_total`).
    ///
    /// Counted before the guards hear of it (inside the send, which wakes them after the
    /// closure): a caller that saw `lost()` fire finds the loss counted already.
    pub(crate) fn mark(&self, reason: LossReason) {
        self.tx.send_if_modified(|state| {
            if state.is_some() {
                return false;
            }
            *state = Some(reason);
            metrics::lost(self.backend, reason, self.holders.load(Ordering::Relaxed));
            true
        });
    }
}

impl LossWatch {
    /// Starts a guard's hold on this lease (see [`Holding`]); a guard keeps it until it
    /// is released or dropped.
    pub(crate) fn holding(&self) -> Holding {
        Holding::start(self.backend, self.holders.clone())
    }

    /// The reason, if the loss has been marked.
    pub(crate) fn current(&self) -> Option<LossReason> {
        *self.rx.borrow()
    }

    /// Resolves once the loss is marked. If the notifier is dropped without marking
    /// (its owner went away), the lease can no longer be vouched for: that counts as closed.
    pub(crate) async fn wait(&self) -> LossReason {
        let mut rx = self.rx.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(state) => state.unwrap_or(LossReason::Closed),
            Err(_) => LossReason::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_reason_wins_and_reaches_every_receiver() {
        let (notifier, watch) = loss_channel(Backend::Etcd);
        let other = watch.clone();
        assert_eq!(watch.current(), None);
        notifier.mark(LossReason::Revoked);
        notifier.mark(LossReason::Closed);
        assert_eq!(watch.wait().await, LossReason::Revoked);
        assert_eq!(other.wait().await, LossReason::Revoked);
    }

    #[tokio::test]
    async fn dropped_notifier_counts_as_closed() {
        let (notifier, watch) = loss_channel(Backend::Etcd);
        drop(notifier);
        assert_eq!(watch.wait().await, LossReason::Closed);
    }
}
