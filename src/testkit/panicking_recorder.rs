//! A metrics recorder that panics when one counter is counted: a fault to inject into
//! the library's background tasks (a recorder's bug, or any panic in such a task).

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

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
