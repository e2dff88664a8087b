//! The Python kazoo lock as a peer of the ZooKeeper rows: the recipe most ZooKeeper users
//! run from Python (Debian's `python3-kazoo`, PyPI's `kazoo`), one lock + release cycle
//! after another on one key, timed inside the Python process. Run only when a Python
//! with kazoo is present.

use std::time::Duration;

use super::BoxResult;
use super::stats::{Cell, histogram, record};

/// Cycles for `seconds`, then prints one latency (microseconds) per line.
const SCRIPT: &str = r#"
import sys, time
from kazoo.client import KazooClient
hosts, seconds, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
zk = KazooClient(hosts=hosts, timeout=10.0)
zk.start(timeout=10)
lock = zk.Lock(path)
lock.acquire(); lock.release()  # creates the lock's node: not timed
latencies = []
end = time.monotonic() + seconds
while not latencies or time.monotonic() < end:
    began = time.monotonic()
    lock.acquire()
    lock.release()
    latencies.append(int((time.monotonic() - began) * 1e6))
zk.stop()
zk.close()
print("\n".join(map(str, latencies)))
"#;

/// kazoo's lock + release cycles on one key for `duration`, as a cell; `None` (with a
/// note on stderr) when no Python with kazoo is installed.
pub async fn cycles(hosts: &str, path: &str, duration: Duration) -> BoxResult<Option<Cell>> {
    let Some(python) = tokio::task::spawn_blocking(fencelock::testkit::python_with_kazoo)
        .await
        .ok()
        .flatten()
    else {
        eprintln!("skipping the kazoo peer: no python3 with kazoo (Debian: python3-kazoo)");
        return Ok(None);
    };
    let output = tokio::process::Command::new(&python)
        .args([
            "-c",
            SCRIPT,
            hosts,
            &duration.as_secs_f64().to_string(),
            path,
        ])
        .kill_on_drop(true)
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!(
            "the kazoo peer failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let mut latencies = histogram()?;
    let mut busy = Duration::ZERO;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Ok(micros) = line.trim().parse::<u64>() {
            let latency = Duration::from_micros(micros);
            busy += latency;
            record(&mut latencies, latency);
        }
    }
    // One cycle after another: their sum is the cell's measured time.
    Ok(Some(Cell::new(
        "distinct keys",
        "zookeeper kazoo Lock",
        1,
        &latencies,
        0,
        busy,
    )))
}
