//! Latency histograms and the figures reported from them.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::BoxResult;

/// A histogram of latencies in microseconds, up to 60 s, 3 significant digits.
pub fn histogram() -> BoxResult<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// Records one latency (saturating at the histogram's bounds).
pub fn record(histogram: &mut Histogram<u64>, latency: Duration) {
    let micros = u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    histogram.saturating_record(micros);
}

/// One measured cell: a workload, a subject (backend or ceiling), a concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: String,
    pub subject: String,
    pub concurrency: usize,
    pub operations: u64,
    pub errors: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Write requests the server handled per operation, where the workload counted them
    /// (etcd's own metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_per_operation: Option<f64>,
}

impl Cell {
    pub fn new(
        workload: &str,
        subject: &str,
        concurrency: usize,
        histogram: &Histogram<u64>,
        errors: u64,
        elapsed: Duration,
    ) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let operations = histogram.len();
        #[allow(clippy::cast_precision_loss)]
        let per_second = operations as f64 / seconds;
        Self {
            workload: workload.to_owned(),
            subject: subject.to_owned(),
            concurrency,
            operations,
            errors,
            seconds,
            per_second,
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            max_us: histogram.max(),
            writes_per_operation: None,
        }
    }
}

impl Cell {
    /// The figures of the table row, in column order (terminal and Markdown alike).
    pub fn columns(&self) -> [String; 9] {
        [
            self.workload.clone(),
            self.subject.clone(),
            self.concurrency.to_string(),
            format!("{:.0}", self.per_second),
            self.p50_us.to_string(),
            self.p90_us.to_string(),
            self.p99_us.to_string(),
            self.max_us.to_string(),
            self.errors.to_string(),
        ]
    }
}

/// Renewal traffic of one backend holding many locks.
#[derive(Clone, Debug, Serialize)]
pub struct Renewal {
    pub subject: String,
    pub locks: usize,
    pub seconds: f64,
    /// Requests the servers received to keep the locks alive.
    pub requests: f64,
    pub requests_per_second: f64,
    /// The process's resident memory grown by taking the locks, per lock (guards, the
    /// library's bookkeeping, the allocator's share), in bytes.
    pub resident_bytes_per_lock: Option<f64>,
    pub note: String,
}
