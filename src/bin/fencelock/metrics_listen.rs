//! `--metrics-listen ADDR`: the library's metrics (see `fencelock::metrics`) served for
//! Prometheus at `http://ADDR/metrics` while the command runs.

use std::net::SocketAddr;

use clap::Args;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Where to serve metrics, if anywhere.
#[derive(Debug, Clone, Args)]
pub struct MetricsListen {
    /// Serve the lock metrics (fencelock_*) for Prometheus on this address, e.g.
    /// 127.0.0.1:9464 (any path answers with the metrics).
    #[arg(long, env = "FENCELOCK_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Label the metrics with lock names too (only for a small, fixed set of names: each
    /// name becomes a series of its own).
    #[arg(long, requires = "metrics_listen")]
    pub metrics_lock_names: bool,
}

impl MetricsListen {
    /// Starts the endpoint (on the current tokio runtime) if one was asked for. Histogram
    /// buckets in seconds, from 100 us to 1 min.
    pub fn start(&self) -> Result<(), String> {
        let Some(address) = self.metrics_listen else {
            return Ok(());
        };
        fencelock::metrics::label_lock_names(self.metrics_lock_names);
        const BUCKETS: &[f64] = &[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets(BUCKETS)
            .map_err(|err| format!("--metrics-listen: {err}"))?
            .install()
            .map_err(|err| format!("--metrics-listen {address}: {err}"))
    }
}
