//! A metrics recorder that panics when one counter is counted: a fault to inject into
//! the library's background tasks (a recorder's bug, or any panic in such a task).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use crate::{LockBackend, LockGuard, LockOptions, LossReason};

/// Panics whenever the counter named `.0` is registered (each `counter!` call registers
/// it); every other metric goes nowhere.
///
/// Installed with [`metrics::with_local_recorder`] around a current-thread runtime's
/// `block_on`, it reaches the tasks that runtime runs: a local recorder is the thread's,
/// and a current-thread runtime polls every task on the thread that blocks on it.
///
/// ```no_run
/// use fencelock::metrics::names::RENEWALS;
/// use fencelock::testkit::PanicsOnCounter;
///
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// metrics::with_local_recorder(&PanicsOnCounter(RENEWALS), || {
///     runtime.block_on(async {
///         // take a lock: its first renewal panics in the renewal task
///     })
/// });
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PanicsOnCounter(pub &'static str);

impl Recorder for PanicsOnCounter {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        assert!(
            key.name() != self.0,
            "an injected fault: the recorder panics counting {}",
            self.0
        );
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Takes `name` for 6 s (so its first renewal comes after about 2 s), and checks that
/// its guard hears [`LossReason::Unrenewed`] well before that time runs out by the
/// client's clock, then reads as not held: what a client must do when the task that
/// renews its locks is stopped at its first renewal (with [`PanicsOnCounter`] on the
/// renewal counter). The lost guard is then dropped (its release is best effort).
///
/// # Panics
///
/// Like `assert!`, if the lock is refused or the loss is not reported so.
pub async fn lost_at_first_renewal<B: LockBackend>(locks: &B, name: &str) {
    let options = LockOptions::new().with_ttl(Duration::from_secs(6));
    let guard = locks.lock(name, &options).await.expect("lock");
    assert!(guard.is_held());
    // The bound only ends a test that would wait for ever: the reason tells.
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the loss is reported");
    assert_eq!(reason, LossReason::Unrenewed);
    assert!(!guard.is_held());
}
