//! What a worker tells the runner, one JSON object per line on its standard output.

use serde::{Deserialize, Serialize};

use super::checker::Section;

/// A worker's report.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Connected to the lock service and storage; about to take the lock.
    Ready { client: String },
    /// Granted the lock.
    Acquired {
        client: String,
        token: u64,
        at_ns: u64,
    },
    /// Read the rows and entered the work phase: the window the runner's faults aim at.
    Working { client: String, token: u64 },
    /// A critical section ended.
    Section { section: Section },
    /// Something failed and the worker retries (a failover, a partition).
    Trouble { client: String, message: String },
}
