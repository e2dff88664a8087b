//! Fault-injection experiments. So far: the checker that turns a log of critical sections
//! into the counts the design asks for, usable on its own as `fencelock check-log`.

pub mod checker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// Options of `fencelock check-log`.
#[derive(Debug, Args)]
pub struct CheckLogArgs {
    /// A file of JSON lines, one critical section each:
    /// `{"client":"a","token":42,"start_ns":1,"end_ns":2,"write":{"Accepted":{"at_ns":2}}}`
    /// (`"write"` may also be `"Rejected"` or `"Failed"`).
    log: PathBuf,
}

/// Prints the verdict as JSON; exits 1 if any stale write was accepted or any token went
/// backwards, 0 otherwise (overlaps alone are what fencing is for).
pub fn check_log(args: &CheckLogArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&args.log) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("fencelock check-log: {}: {err}", args.log.display());
            return ExitCode::from(2);
        }
    };
    let mut sections = Vec::new();
    for (number, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<checker::Section>(line) {
            Ok(section) => sections.push(section),
            Err(err) => {
                eprintln!("fencelock check-log: line {}: {err}", number + 1);
                return ExitCode::from(2);
            }
        }
    }
    let verdict = checker::check(&sections);
    match serde_json::to_string_pretty(&verdict) {
        Ok(json) => println!("{json}"),
        Err(err) => {
            eprintln!("fencelock check-log: {err}");
            return ExitCode::from(2);
        }
    }
    if verdict.stale_accepted > 0 || verdict.token_inversions > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
