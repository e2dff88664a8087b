//! `fencelock chaos` scenarios (design §6) run by the real command against real servers
//! and worker processes; each test reads the rows of `--json` and asserts what the design
//! says about them. One file per behaviour.

mod clock_jump;
mod etcd_with_fencing;
mod naive_release;
mod over_tls;
mod partition;
mod redis_failover;
mod soak;
mod unfenced_updates;
mod zookeeper_with_fencing;

use std::process::Command;

use serde_json::Value;

/// Runs `fencelock chaos` with `args`; returns its rows and whether it exited 0.
pub fn chaos(args: &[&str]) -> (Vec<Value>, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("chaos.json");
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("chaos")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("running fencelock chaos");
    let text = std::fs::read_to_string(&json).unwrap_or_else(|err| {
        panic!(
            "no JSON written ({err}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let rows: Vec<Value> = serde_json::from_str(&text).expect("valid JSON");
    for row in &rows {
        assert_eq!(row["status"], "ran", "a run did not complete: {row:#}");
    }
    (rows, output.status.success())
}

/// The row of `scenario` and `backend`.
pub fn row<'a>(rows: &'a [Value], scenario: &str, backend: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["scenario"] == scenario && r["backend"] == backend)
        .unwrap_or_else(|| panic!("no row for {scenario} {backend} in {rows:#?}"))
}

/// A count of the checker's verdict.
pub fn count(row: &Value, field: &str) -> u64 {
    row["verdict"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no verdict.{field} in {row:#}"))
}

/// Lost updates of the fenced or unfenced counter.
pub fn lost(row: &Value, path: &str) -> i64 {
    row["lost_updates"][path]
        .as_i64()
        .unwrap_or_else(|| panic!("no lost_updates.{path} in {row:#}"))
}
