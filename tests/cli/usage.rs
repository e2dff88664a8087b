//! Every usage error of `fencelock run` exits 2 (clap's code, docs/run.md's table) with a
//! message that names the problem; `--help` states the limits.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .arg("run")
        .args(args)
        .env_remove("FENCELOCK_ETCD")
        .env_remove("FENCELOCK_BACKEND")
        .env_remove("FENCELOCK_REDLOCK")
        .output()
        .expect("run");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_exit_2_and_say_what_is_wrong() {
    let long = "x".repeat(5000);
    let cases: [(&[&str], &str); 9] = [
        (
            &["--lock", "x", "--ttl", "banana", "--", "true"],
            "not a duration",
        ),
        (&["--lock", "x", "--ttl", "0", "--", "true"], "above zero"),
        (
            &["--lock", "x", "--ttl", "-5s", "--", "true"],
            "cannot be negative",
        ),
        (
            &["--lock", "x", "--ttl", "500ms", "--", "true"],
            "below this backend's minimum",
        ),
        (
            &["--lock", "x", "--permits", "0", "--", "true"],
            "at least one permit",
        ),
        (&["--lock", &long, "--", "true"], "5000 bytes in all"),
        (
            &[
                "--backend",
                "redis",
                "--lock",
                "x",
                "--ttl",
                "50ms",
                "--",
                "true",
            ],
            "below this backend's minimum",
        ),
        (
            &["--backend", "redlock", "--lock", "x", "--", "true"],
            "needs its masters",
        ),
        (
            &[
                "--backend",
                "redlock",
                "--redlock",
                "redis://127.0.0.1:1/,redis://127.0.0.1:2/,redis://127.0.0.1:3/",
                "--permits",
                "2",
                "--lock",
                "x",
                "--",
                "true",
            ],
            "Redlock has no semaphore",
        ),
    ];
    for (args, says) in cases {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("-- -5"), "no misleading tip: {stderr}");
        assert!(stderr.len() < 1000, "long input is cut: {stderr}");
    }
    let (code, stderr) = run(&[
        "--etcd",
        "ftp://127.0.0.1:2379",
        "--lock",
        "x",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unsupported scheme"), "{stderr}");
}

#[test]
fn durations_take_humantime_forms() {
    // `--grace` above half of `--ttl` is refused before anything else, with both values
    // as parsed: the message shows what each form became.
    for (ttl, grace, says) in [
        ("1m30s", "1m", "--grace 60s is more than half of --ttl 90s"),
        (
            "400ms",
            "250ms",
            "--grace 250ms is more than half of --ttl 400ms",
        ),
        (
            "1h 15min",
            "40m",
            "--grace 2400s is more than half of --ttl 4500s",
        ),
        // A bare number is seconds, as before humantime.
        ("10", "6", "--grace 6s is more than half of --ttl 10s"),
        ("1.5", "1", "--grace 1s is more than half of --ttl 1.5s"),
    ] {
        let (code, stderr) = run(&["--lock", "x", "--ttl", ttl, "--grace", grace, "--", "true"]);
        assert_eq!(code, Some(2), "{ttl} {grace}: {stderr}");
        assert!(stderr.contains(says), "{ttl} {grace}: {stderr}");
    }
    let (code, stderr) = run(&["--lock", "x", "--ttl", "10 parsecs", "--", "true"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a duration"), "{stderr}");
    assert!(
        stderr.contains("1m30s"),
        "the error shows the forms: {stderr}"
    );
}

#[test]
fn help_states_the_limits() {
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["run", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("at most 24h"), "{help}");
    assert!(help.contains("least 1s on etcd"), "{help}");
    assert!(help.contains("100ms on Redis"), "{help}");
    assert!(help.contains("1 to 128 characters"), "{help}");
    assert!(help.contains("1m30s"), "{help}");
    assert!(help.contains("a bare number is seconds"), "{help}");
}
