//! Metric keys whose labels are built once per process, so that reporting one allocates
//! nothing.
//!
//! The `metrics` macros build a `Vec` of labels on every call unless every label is a
//! literal, and ours are not (the backend is a value): that was nine allocations per Redis
//! lock + release cycle with no recorder installed, a sixth of the cycle's allocations
//! (`examples/alloc_count.rs`), and on a 2-core machine the client's allocations are what
//! its CPU goes to at high concurrency. Here each label set lives in a `static` cell,
//! filled on first use, and keys borrow it (`Key::from_static_labels`). The recorder is
//! asked for the handle on every report, as the macros do, so a recorder installed after
//! the first lock still sees everything.

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata};

use crate::Backend;

/// The backends a label set can name: one cell per backend.
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

/// `backend` alone, per backend.
pub(super) struct BackendLabels([OnceLock<[Label; 1]>; BACKENDS]);

impl BackendLabels {
    pub(super) const fn new() -> Self {
        Self([const { OnceLock::new() }; BACKENDS])
    }

    pub(super) fn get(&'static self, backend: Backend) -> &'static [Label] {
        self.0.get(index(backend)).map_or(&[], |cell| {
            cell.get_or_init(|| [Label::from_static_parts("backend", backend.as_str())])
        })
    }
}

/// `backend` and one more label with `N` possible values, per backend and value.
pub(super) struct OutcomeLabels<const N: usize>([[OnceLock<[Label; 2]>; N]; BACKENDS]);

impl<const N: usize> OutcomeLabels<N> {
    pub(super) const fn new() -> Self {
        Self([const { [const { OnceLock::new() }; N] }; BACKENDS])
    }

    /// The set for `backend` and `key = value`, where `value` is the `at`-th of this set's
    /// values: a caller names each value at one index only.
    pub(super) fn get(
        &'static self,
        backend: Backend,
        at: usize,
        key: &'static str,
        value: &'static str,
    ) -> &'static [Label] {
        self.0
            .get(index(backend))
            .and_then(|cells| cells.get(at))
            .map_or(&[], |cell| {
                cell.get_or_init(|| {
                    [
                        Label::from_static_parts("backend", backend.as_str()),
                        Label::from_static_parts(key, value),
                    ]
                })
            })
    }
}

pub(super) fn counter(name: &'static str, labels: &'static [Label]) -> Counter {
    let key = Key::from_static_labels(name, labels);
    metrics::with_recorder(|recorder| recorder.register_counter(&key, &METADATA))
}

pub(super) fn gauge(name: &'static str, labels: &'static [Label]) -> Gauge {
    let key = Key::from_static_labels(name, labels);
    metrics::with_recorder(|recorder| recorder.register_gauge(&key, &METADATA))
}

pub(super) fn histogram(name: &'static str, labels: &'static [Label]) -> Histogram {
    let key = Key::from_static_labels(name, labels);
    metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
}

#[cfg(test)]
mod tests {
    use super::*;

    static SETS: OutcomeLabels<2> = OutcomeLabels::new();
    static BACKEND: BackendLabels = BackendLabels::new();

    #[test]
    fn label_sets_name_what_the_macros_would() {
        let set = SETS.get(Backend::Redis, 1, "outcome", "busy");
        assert_eq!(
            set,
            &[
                Label::new("backend", "redis"),
                Label::new("outcome", "busy")
            ]
        );
        // Built once: the same cell the second time.
        assert!(std::ptr::eq(
            set,
            SETS.get(Backend::Redis, 1, "outcome", "busy")
        ));
        assert_eq!(
            BACKEND.get(Backend::ZooKeeper),
            &[Label::new("backend", "zookeeper")]
        );
        // An index past the set's values is a bug of the caller: no labels, no panic.
        assert!(SETS.get(Backend::Etcd, 5, "outcome", "x").is_empty());
    }
}
