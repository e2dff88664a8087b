//! `fencelock check-log` reads a log of critical sections and reports what went wrong.

use std::process::Command;

#[test]
fn a_stale_write_accepted_fails_the_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("sections.jsonl");
    std::fs::write(
        &log,
        concat!(
            r#"{"client":"a","token":10,"start_ns":0,"end_ns":50,"write":{"Accepted":{"order":45}}}"#,
            "\n",
            r#"{"client":"b","token":12,"start_ns":20,"end_ns":30,"write":{"Accepted":{"order":25}}}"#,
            "\n",
        ),
    )
    .expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("check-log")
        .arg(&log)
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let verdict: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(verdict["overlapping"], 1);
    assert_eq!(verdict["stale_accepted"], 1);
}

#[test]
fn a_fenced_run_passes_the_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("sections.jsonl");
    std::fs::write(
        &log,
        concat!(
            r#"{"client":"a","token":10,"start_ns":0,"end_ns":50,"write":"Rejected"}"#,
            "\n",
            r#"{"client":"b","token":12,"start_ns":20,"end_ns":30,"write":{"Accepted":{"order":25}}}"#,
            "\n",
        ),
    )
    .expect("write");
    // Its verdict is captured, not printed into the test output.
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("check-log")
        .arg(&log)
        .output()
        .expect("run");
    assert!(output.status.success());
    let verdict: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(verdict["stale_accepted"], 0);
    assert_eq!(verdict["stale_rejected"], 1);
}
