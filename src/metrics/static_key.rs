//! Metric keys built once per process, so that reporting one allocates nothing and
//! hashes nothing.
//!
//! The `metrics` macros build a `Vec` of labels on every call unless every label is a
//! literal, and ours are not (the backend is a value): that was nine allocations per Redis
//! lock + release cycle with no recorder installed, a sixth of the cycle's allocations
//! (`examples/alloc_count.rs`), and on a 2-core machine the client's allocations are what
//! its CPU goes to at high concurrency. A `Key` also hashes its name and every label when
//! it is made (`Key::builder`): six keys per cycle were about 1,300 instructions, 3 % of
//! the client's share of a Redis cycle (callgrind). Here each key lives in a `static`
//! cell, made on first use. The recorder is asked for the handle on every report, as the
//! macros do, so a recorder installed after the first lock still sees everything.

use std::borrow::Cow;
use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata};

use crate::Backend;

/// The backends a key can name: one cell per backend.
const BACKENDS: usize = 6;

fn index(backend: Backend) -> usize {
    match backend {
        Backend::Etcd => 0,
        Backend::Redis => 1,
        Backend::Redlock => 2,
        Backend::Postgres => 3,
        Backend::MySql => 4,
        Backend::ZooKeeper => 5,
    }
}

/// What the macros would give the recorder as the metric's metadata.
static METADATA: Metadata<'static> = Metadata::new(
    "fencelock::metrics",
    Level::INFO,
    Some("fencelock::metrics"),
);

/// The keys of one metric: labelled `backend`, and with `N > 1` one more label with `N`
/// possible values; one cell per backend and value.
pub(super) struct Keys<const N: usize> {
    name: &'static str,
    cells: [[OnceLock<Key>; N]; BACKENDS],
}

impl<const N: usize> Keys<N> {
    /// The keys of metric `name`.
    pub(super) const fn new(name: &'static str) -> Self {
        Self {
            name,
            cells: [const { [const { OnceLock::new() }; N] }; BACKENDS],
        }
    }

    /// The key labelled `backend` alone.
    pub(super) fn backend(&'static self, backend: Backend) -> Cow<'static, Key> {
        self.make(backend, 0, &[])
    }

    /// The key labelled `backend` and `label = value`, where `value` is the `at`-th of
    /// this metric's values: a caller names each value at one index only.
    pub(super) fn labelled(
        &'static self,
        backend: Backend,
        at: usize,
        label: &'static str,
        value: &'static str,
    ) -> Cow<'static, Key> {
        self.make(backend, at, &[(label, value)])
    }

    /// The cached key, or, for an index past this metric's values (a caller's bug), one
    /// made now.
    fn make(
        &'static self,
        backend: Backend,
        at: usize,
        more: &[(&'static str, &'static str)],
    ) -> Cow<'static, Key> {
        let build = || {
            let labels: Vec<Label> = std::iter::once(("backend", backend.as_str()))
                .chain(more.iter().copied())
                .map(|(key, value)| Label::from_static_parts(key, value))
                .collect();
            Key::from_parts(self.name, labels)
        };
        match self
            .cells
            .get(index(backend))
            .and_then(|cells| cells.get(at))
        {
            Some(cell) => Cow::Borrowed(cell.get_or_init(build)),
            None => Cow::Owned(build()),
        }
    }
}

pub(super) fn counter(key: &Key) -> Counter {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
}

pub(super) fn gauge(key: &Key) -> Gauge {
    metrics::with_recorder(|recorder| recorder.register_gauge(key, &METADATA))
}

pub(super) fn histogram(key: &Key) -> Histogram {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
}

#[cfg(test)]
mod tests {
    use super::*;

    static OUTCOMES: Keys<2> = Keys::new("m");
    static BACKEND: Keys<1> = Keys::new("b");

    #[test]
    fn keys_name_what_the_macros_would_and_are_built_once() {
        let key = OUTCOMES.labelled(Backend::Redis, 1, "outcome", "busy");
        assert_eq!(
            *key,
            Key::from_parts(
                "m",
                vec![
                    Label::new("backend", "redis"),
                    Label::new("outcome", "busy")
                ]
            )
        );
        // Built once: the same cell the second time.
        let again = OUTCOMES.labelled(Backend::Redis, 1, "outcome", "busy");
        assert!(
            matches!((&key, &again), (Cow::Borrowed(a), Cow::Borrowed(b)) if std::ptr::eq(*a, *b))
        );
        assert_eq!(
            *BACKEND.backend(Backend::ZooKeeper),
            Key::from_parts("b", vec![Label::new("backend", "zookeeper")])
        );
        // An index past the metric's values is a bug of the caller: a key made for the
        // report, no panic.
        let past = OUTCOMES.labelled(Backend::Etcd, 5, "outcome", "x");
        assert!(matches!(past, Cow::Owned(_)));
        assert_eq!(past.labels().count(), 2);
    }
}
