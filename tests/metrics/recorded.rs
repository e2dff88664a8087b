//! The process's recording recorder, and sums over its series.
//!
//! `metrics-util`'s debugging recorder drains what it returns (counters and gauges are
//! swapped to zero, histograms emptied): every snapshot is added to one store here, so
//! that tests running side by side do not take each other's values.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Series = (MetricKind, String, Vec<(String, String)>);

#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

pub struct Recorded {
    snapshotter: Snapshotter,
    series: Mutex<HashMap<Series, Value>>,
}

/// The recorder of this test process, installed by the first call.
pub fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        fencelock::metrics::label_lock_names(true);
        Recorded {
            snapshotter,
            series: Mutex::default(),
        }
    })
}

impl Recorded {
    fn collect<T>(&self, read: impl FnOnce(&HashMap<Series, Value>) -> T) -> T {
        let mut series = self.series.lock().expect("store");
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let entry = series.entry((kind, key.name().to_owned(), labels));
            match value {
                DebugValue::Counter(n) => {
                    let Value::Counter(sum) = entry.or_insert(Value::Counter(0)) else {
                        unreachable!("a counter series holds counts")
                    };
                    *sum += n;
                }
                // The recorder swaps a gauge to zero and goes on adding to zero: the sum
                // of what it returned is the gauge.
                DebugValue::Gauge(g) => {
                    let Value::Gauge(sum) = entry.or_insert(Value::Gauge(0.0)) else {
                        unreachable!("a gauge series holds a level")
                    };
                    *sum += g.into_inner();
                }
                DebugValue::Histogram(values) => {
                    let Value::Histogram(all) = entry.or_insert(Value::Histogram(Vec::new()))
                    else {
                        unreachable!("a histogram series holds samples")
                    };
                    all.extend(values.into_iter().map(|v| v.into_inner()));
                }
            }
        }
        read(&series)
    }

    fn matching<'a>(
        series: &'a HashMap<Series, Value>,
        kind: MetricKind,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Value> + 'a {
        series.iter().filter_map(move |((k, n, have), value)| {
            let wanted = *k == kind
                && n == name
                && labels
                    .iter()
                    .all(|(lk, lv)| have.iter().any(|(hk, hv)| hk == lk && hv == lv));
            wanted.then_some(value)
        })
    }

    /// The sum of counter `name` over the series that carry all of `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.collect(|series| {
            Self::matching(series, MetricKind::Counter, name, labels)
                .map(|v| match v {
                    Value::Counter(n) => *n,
                    _ => 0,
                })
                .sum()
        })
    }

    /// The level of gauge `name` summed over the series that carry all of `labels`.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.collect(|series| {
            Self::matching(series, MetricKind::Gauge, name, labels)
                .map(|v| match v {
                    Value::Gauge(g) => *g,
                    _ => 0.0,
                })
                .sum()
        })
    }

    /// Every sample of histogram `name` in the series that carry all of `labels`.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.collect(|series| {
            Self::matching(series, MetricKind::Histogram, name, labels)
                .flat_map(|v| match v {
                    Value::Histogram(all) => all.clone(),
                    _ => Vec::new(),
                })
                .collect()
        })
    }

    /// Waits until counter `name` with `labels` reaches `at_least`, within `limit`: for
    /// what happens in the background (a renewal, a loss found by the renewal task).
    pub async fn counter_reaches(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        at_least: u64,
        limit: std::time::Duration,
    ) -> u64 {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let now = self.counter(name, labels);
            if now >= at_least || tokio::time::Instant::now() >= deadline {
                return now;
            }
            // No event tells a test that a background task updated a counter.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
