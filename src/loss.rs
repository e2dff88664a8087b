//! Loss of ownership: why a lease is gone, and the signal that tells every guard.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tokio::sync::Notify;

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
    /// The client's renewal task stopped (as after a panic in it, or its runtime shut
    /// down): the lock is given up rather than held with nobody renewing it or
    /// reporting its expiry, its key left to expire (Redis's renewer, an etcd session's
    /// keep-alive, a ZooKeeper session's monitor, which then closes the session).
    Unrenewed,
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
            Self::Unrenewed => "the client's renewal task stopped",
        })
    }
}

/// The signal one notifier and its watches share: the state word, and the wake-up of
/// the guards waiting on it.
///
/// Not a `tokio::sync::watch`: every Redis lock cycle makes one of these and drops it,
/// and a watch's sender wakes eight `Notify`s when dropped (eight mutexes taken), where
/// this wakes one, and only if the loss was never marked (about 2 % of the client's
/// time at 64 concurrent Redis lock cycles went to the watch, sampled with `perf`).
#[derive(Debug, Default)]
struct Signal {
    /// [`LIVE`], [`MARKING`], [`DROPPED`], or a reason's code ([`code`]).
    state: AtomicU8,
    notify: Notify,
}

/// No loss marked, and the notifier still there.
const LIVE: u8 = 0;
/// A loss is being counted: readers do not see it yet (see [`LossNotifier::mark`]).
const MARKING: u8 = 1;
/// The notifier was dropped without marking a loss.
const DROPPED: u8 = 2;

/// Every reason, each at its code's place past [`DROPPED`] (see [`code`]).
const REASONS: [LossReason; 7] = [
    LossReason::Expired,
    LossReason::Revoked,
    LossReason::Closed,
    LossReason::Disconnected,
    LossReason::KeyDeleted,
    LossReason::Unwatched,
    LossReason::Unrenewed,
];

/// The state word of a marked `reason` (a match, so that a new reason cannot be left
/// without a code; `REASONS` must list it at the same place: unit-tested).
fn code(reason: LossReason) -> u8 {
    DROPPED
        + 1
        + match reason {
            LossReason::Expired => 0,
            LossReason::Revoked => 1,
            LossReason::Closed => 2,
            LossReason::Disconnected => 3,
            LossReason::KeyDeleted => 4,
            LossReason::Unwatched => 5,
            LossReason::Unrenewed => 6,
        }
}

/// The reason a state word marks, if it marks one.
fn reason(state: u8) -> Option<LossReason> {
    REASONS
        .get(usize::from(state.checked_sub(DROPPED + 1)?))
        .copied()
}

/// The sending half: marks the loss once, for every receiver at once.
#[derive(Debug)]
pub(crate) struct LossNotifier {
    signal: Arc<Signal>,
    backend: Backend,
    /// Guards holding a lock on this lease now: what a loss costs (`metrics.rs`).
    holders: Arc<AtomicUsize>,
}

/// The receiving half, cloned into every guard.
#[derive(Clone, Debug)]
pub(crate) struct LossWatch {
    signal: Arc<Signal>,
    backend: Backend,
    holders: Arc<AtomicUsize>,
}

/// A loss signal for one lease of `backend` (or one connection).
pub(crate) fn loss_channel(backend: Backend) -> (LossNotifier, LossWatch) {
    let signal = Arc::new(Signal::default());
    let holders = Arc::new(AtomicUsize::new(0));
    (
        LossNotifier {
            signal: signal.clone(),
            backend,
            holders: holders.clone(),
        },
        LossWatch {
            signal,
            backend,
            holders,
        },
    )
}

impl LossNotifier {
    /// Records the loss; the first reason wins and later ones are ignored. The first
    /// counts every lock held on the lease as lost (`fencelock_losses_total`).
    ///
    /// Counted before the guards hear of it: the state reads as "no loss" while it is
    /// counted ([`MARKING`]), so a caller that saw `lost()` fire, or `is_held()` turn
    /// false, finds the loss counted already. A second mark meanwhile returns only once
    /// the first is visible (as a second send on the watch this replaced waited for its
    /// lock): a caller that marked a loss and then acts on it (`Session::close` marks,
    /// then revokes) never leaves a guard that still reads as held. The count runs the
    /// installed metrics recorder, which may block or panic: a panic is caught, logged
    /// and the loss published all the same (the renewal task that marks Redis losses,
    /// and every caller that acts after marking, go on).
    pub(crate) fn mark(&self, reason: LossReason) {
        let state = &self.signal.state;
        if let Err(mut seen) =
            state.compare_exchange(LIVE, MARKING, Ordering::AcqRel, Ordering::Acquire)
        {
            // Only while a recorder is slow: yield, then sleep in short steps rather
            // than spin on a core.
            let mut turns = 0u32;
            while seen == MARKING {
                if turns < 64 {
                    std::thread::yield_now();
                    turns += 1;
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                seen = state.load(Ordering::Acquire);
            }
            return;
        }
        let holders = self.holders.load(Ordering::Relaxed);
        let counted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            metrics::lost(self.backend, reason, holders);
        }));
        state.store(code(reason), Ordering::Release);
        self.signal.notify.notify_waiters();
        if counted.is_err() {
            tracing::error!(
                backend = %self.backend,
                %reason,
                "the metrics recorder panicked counting a lost lock; the loss is reported all the same"
            );
        }
    }
}

impl Drop for LossNotifier {
    /// A notifier dropped without marking (its owner went away) leaves a lease nobody
    /// vouches for: its waiters hear "closed" (see [`LossWatch::wait`]).
    fn drop(&mut self) {
        let state = &self.signal.state;
        if state
            .compare_exchange(LIVE, DROPPED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.signal.notify.notify_waiters();
        }
    }
}

impl LossWatch {
    /// Starts a guard's hold on this lease (see [`Holding`]); a guard keeps it until it
    /// is released or dropped.
    pub(crate) fn holding(&self) -> Holding {
        Holding::start(self.backend, self.holders.clone())
    }

    /// The reason, if the loss has been marked; `Closed` if the notifier was dropped
    /// without marking, as [`wait`](Self::wait) says. A guard's `is_held()` and a
    /// session's "may a new lock join" read this: a lease whose notifier went away (the
    /// task that owned it ended without reporting, as after a panic) is nobody's to
    /// vouch for, and must not read as held while `lost()` says closed.
    pub(crate) fn current(&self) -> Option<LossReason> {
        match self.signal.state.load(Ordering::Acquire) {
            DROPPED => Some(LossReason::Closed),
            state => reason(state),
        }
    }

    /// Resolves once the loss is marked. If the notifier is dropped without marking
    /// (its owner went away), the lease can no longer be vouched for: that counts as closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits, and a new call waits again.
    pub(crate) async fn wait(&self) -> LossReason {
        let signal = &self.signal;
        loop {
            // Armed before the state is read: a mark or a drop after the read wakes it
            // (`notify_waiters` reaches every `Notified` made before it).
            let notified = signal.notify.notified();
            let state = signal.state.load(Ordering::Acquire);
            if let Some(reason) = reason(state) {
                return reason;
            }
            if state == DROPPED {
                return LossReason::Closed;
            }
            notified.await;
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
        assert_eq!(watch.current(), None);
        drop(notifier);
        assert_eq!(watch.wait().await, LossReason::Closed);
        // Read without waiting too: a guard's `is_held()` must agree with its `lost()`.
        assert_eq!(watch.current(), Some(LossReason::Closed));
    }

    #[tokio::test]
    async fn a_waiter_armed_before_the_mark_is_woken_and_every_reason_reads_back() {
        for reason in REASONS {
            let (notifier, watch) = loss_channel(Backend::Redis);
            let waiting = tokio::spawn({
                let watch = watch.clone();
                async move { watch.wait().await }
            });
            tokio::task::yield_now().await;
            notifier.mark(reason);
            assert_eq!(waiting.await.ok(), Some(reason));
            assert_eq!(watch.current(), Some(reason));
            // A notifier dropped after marking leaves the reason as it was.
            drop(notifier);
            assert_eq!(watch.wait().await, reason);
        }
    }

    #[test]
    fn no_state_word_reads_as_a_loss_but_a_marked_one() {
        assert_eq!(reason(LIVE), None);
        assert_eq!(reason(MARKING), None);
        assert_eq!(reason(DROPPED), None);
        assert_eq!(reason(u8::MAX), None);
        for r in REASONS {
            assert_eq!(reason(code(r)), Some(r));
        }
    }

    /// A metrics recorder whose loss counter runs `count` (a stall, a panic).
    struct Counting<F>(F);

    struct CountWith<F>(Arc<F>);

    impl<F: Fn() + Send + Sync + 'static> ::metrics::CounterFn for CountWith<F> {
        fn increment(&self, _: u64) {
            (self.0)();
        }
        fn absolute(&self, _: u64) {}
    }

    impl<F: Fn() + Clone + Send + Sync + 'static> ::metrics::Recorder for Counting<F> {
        fn describe_counter(
            &self,
            _: ::metrics::KeyName,
            _: Option<::metrics::Unit>,
            _: ::metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: ::metrics::KeyName,
            _: Option<::metrics::Unit>,
            _: ::metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: ::metrics::KeyName,
            _: Option<::metrics::Unit>,
            _: ::metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            _: &::metrics::Key,
            _: &::metrics::Metadata<'_>,
        ) -> ::metrics::Counter {
            ::metrics::Counter::from_arc(Arc::new(CountWith(Arc::new(self.0.clone()))))
        }
        fn register_gauge(
            &self,
            _: &::metrics::Key,
            _: &::metrics::Metadata<'_>,
        ) -> ::metrics::Gauge {
            ::metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            _: &::metrics::Key,
            _: &::metrics::Metadata<'_>,
        ) -> ::metrics::Histogram {
            ::metrics::Histogram::noop()
        }
    }

    /// `Session::close` marks the loss, then revokes: a mark that came first and is
    /// still being counted must not let close's own mark return before the loss shows.
    #[test]
    fn a_second_mark_returns_only_once_the_first_shows() {
        use std::sync::Barrier;
        use std::sync::mpsc;
        let (notifier, watch) = loss_channel(Backend::Etcd);
        let _hold = watch.holding();
        let notifier = Arc::new(notifier);
        // The first mark's count waits at the gate twice: counting, then let go.
        let gate = Arc::new(Barrier::new(2));
        let first = std::thread::spawn({
            let (notifier, gate) = (notifier.clone(), gate.clone());
            move || {
                let stall = move || {
                    gate.wait();
                    gate.wait();
                };
                ::metrics::with_local_recorder(&Counting(stall), || {
                    notifier.mark(LossReason::Revoked);
                });
            }
        });
        gate.wait();
        assert_eq!(watch.current(), None, "not shown while it is counted");
        let (seen, heard) = mpsc::channel();
        let second = std::thread::spawn({
            let (notifier, watch) = (notifier.clone(), watch.clone());
            move || {
                notifier.mark(LossReason::Closed);
                let _ = seen.send(watch.current());
            }
        });
        // Returned at once, the second mark would report the loss unseen; it waits for
        // the first instead (a wait that ends here only if it did not, which fails).
        let early = heard
            .recv_timeout(std::time::Duration::from_millis(200))
            .ok();
        if let Some(early) = early {
            assert_eq!(
                early,
                Some(LossReason::Revoked),
                "the second mark returned first"
            );
        }
        gate.wait();
        assert!(first.join().is_ok());
        assert!(second.join().is_ok());
        if early.is_none() {
            assert_eq!(heard.recv().ok(), Some(Some(LossReason::Revoked)));
        }
        assert_eq!(watch.current(), Some(LossReason::Revoked));
    }

    #[tokio::test]
    async fn a_recorder_that_panics_still_lets_the_loss_show() {
        let (notifier, watch) = loss_channel(Backend::Redis);
        let _hold = watch.holding();
        let panics = || panic!("a recorder's bug");
        // The mark returns (a panic here fails the test): its caller goes on.
        ::metrics::with_local_recorder(&Counting(panics), || {
            notifier.mark(LossReason::Expired);
        });
        assert_eq!(watch.current(), Some(LossReason::Expired));
        assert_eq!(watch.wait().await, LossReason::Expired);
    }
}
