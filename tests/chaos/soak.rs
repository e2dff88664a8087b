//! The request-level fault soak (`fencelock chaos --soak`), short: its checker finds no
//! violation, and it really injected faults and checked grants, of single locks and of
//! several at once (a soak that did nothing would pass too). CI runs it again for two
//! minutes with a fresh seed.

use std::process::Command;

#[test]
fn a_short_soak_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("soak.json");
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["chaos", "--soak", "20s", "--seed", "20261130", "--json"])
        .arg(&json)
        .output()
        .expect("running fencelock chaos --soak");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("JSON");
    let count = |section: &str, what: &str| report[section][what].as_u64().unwrap_or(0);
    assert!(count("operations", "granted") >= 50, "{stdout}");
    let faults: u64 = report["faults"].as_object().map_or(0, |f| {
        f.values().filter_map(serde_json::Value::as_u64).sum()
    });
    assert!(faults >= 20, "{stdout}");
    assert!(count("faults", "late requests") >= 1, "{stdout}");
    assert!(count("checked", "exclusion") >= 50, "{stdout}");
    // Several locks at once among the single ones: taken, and granted.
    assert!(count("operations", "multi acquisitions") >= 20, "{stdout}");
    assert!(count("operations", "multi grants") >= 1, "{stdout}");
    assert!(count("checked", "multi join") >= 10, "{stdout}");
    assert!(output.status.success(), "{stdout}");
    assert_eq!(
        report["violations"].as_array().map_or(1, Vec::len),
        0,
        "{stdout}"
    );
}
