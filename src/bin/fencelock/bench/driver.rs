//! Runs an operation in a loop on N workers for a fixed time, into a histogram.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::BoxResult;
use super::stats::{self, Cell};

/// Calls `op(worker, iteration)` on `concurrency` workers until `duration` has passed and
/// reports the latency of every successful call. Failed calls are counted, not timed.
pub async fn drive<F, Fut>(
    workload: &str,
    subject: &str,
    concurrency: usize,
    duration: Duration,
    op: F,
) -> BoxResult<Cell>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = BoxResult<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let op = op.clone();
        workers.push(tokio::spawn(async move {
            let mut histogram = stats::histogram()?;
            let mut errors = 0u64;
            let mut iteration = 0u64;
            let mut first_error = None;
            while Instant::now() < deadline {
                let began = Instant::now();
                match op(worker, iteration).await {
                    Ok(()) => stats::record(&mut histogram, began.elapsed()),
                    Err(err) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| err.to_string());
                    }
                }
                iteration += 1;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((histogram, errors, first_error))
        }));
    }
    let mut total: Histogram<u64> = stats::histogram()?;
    let mut errors = 0;
    let mut first_error = None;
    for worker in workers {
        let (histogram, worker_errors, worker_first) = worker.await??;
        total.add(&histogram)?;
        errors += worker_errors;
        first_error = first_error.or(worker_first);
    }
    let elapsed = started.elapsed();
    if total.is_empty() {
        return Err(format!(
            "{workload} / {subject}: every call failed ({})",
            first_error.unwrap_or_default()
        )
        .into());
    }
    Ok(Cell::new(
        workload,
        subject,
        concurrency,
        &total,
        errors,
        elapsed,
    ))
}
