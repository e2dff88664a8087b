//! The chaos table: one row per scenario and backend, for the terminal, the guide
//! (`docs/chaos.md`, Markdown) and `--json`.

use serde::Serialize;

use super::checker::Verdict;
use super::scenarios::{LostUpdates, Scenario};
use super::worker::ChaosBackend;

/// How one scenario run for one backend ended.
#[derive(Debug, Serialize)]
pub struct Row {
    pub scenario: Scenario,
    pub title: &'static str,
    pub backend: &'static str,
    /// `ran`, `skipped` or `error`.
    pub status: &'static str,
    pub verdict: Verdict,
    pub lost_updates: LostUpdates,
    pub expected: &'static str,
    /// Whether what happened is what the design expects (for the Redis rows of S4, S5
    /// and S7 that means the failure was reproduced).
    pub as_expected: bool,
    /// What the run observed, or why it was skipped or failed.
    pub note: String,
    pub seconds: f64,
}

impl Row {
    /// A run that was skipped or failed before it could be judged.
    pub fn not_run(
        scenario: Scenario,
        backend: ChaosBackend,
        status: &'static str,
        note: String,
    ) -> Self {
        Self {
            scenario,
            title: scenario.title(),
            backend: backend.name(),
            status,
            verdict: Verdict::default(),
            lost_updates: LostUpdates::default(),
            expected: scenario.expected(backend),
            as_expected: false,
            note,
            seconds: 0.0,
        }
    }
}

const HEADER: [&str; 12] = [
    "scenario",
    "backend",
    "sections",
    "overlaps",
    "stale accepted",
    "stale rejected",
    "token inversions",
    "lost updates fenced",
    "lost updates unfenced",
    "foreign deletes",
    "as expected",
    "observed",
];

fn cells(row: &Row) -> [String; 12] {
    let v = &row.verdict;
    let ran = row.status == "ran";
    let n = |x: usize| if ran { x.to_string() } else { "-".into() };
    let l = |x: i64| if ran { x.to_string() } else { "-".into() };
    [
        format!("{:?}", row.scenario),
        row.backend.to_owned(),
        n(v.sections),
        n(v.overlapping),
        n(v.stale_accepted),
        n(v.stale_rejected),
        n(v.token_inversions),
        l(row.lost_updates.fenced),
        l(row.lost_updates.unfenced),
        n(v.foreign_deletes),
        match (row.status, row.as_expected) {
            ("ran", true) => "yes".into(),
            ("ran", false) => "NO".into(),
            (status, _) => status.to_owned(),
        },
        row.note.clone(),
    ]
}

/// The table for a terminal: aligned columns, the note last.
pub fn terminal(rows: &[Row]) -> String {
    let short = [
        "scen", "backend", "sect", "overlap", "stale+", "stale-", "inv", "lost(f)", "lost(u)",
        "del", "ok", "observed",
    ];
    let mut out = String::new();
    let widths = [4, 11, 5, 7, 6, 6, 4, 7, 7, 4, 7, 0];
    let mut line = |cols: &[String]| {
        for (col, width) in cols.iter().zip(widths) {
            out.push_str(&format!("{col:<width$} "));
        }
        out.push('\n');
    };
    line(&short.map(str::to_owned));
    for row in rows {
        line(&cells(row));
    }
    out.push_str(
        "stale+ = stale writes accepted, stale- = rejected, inv = token inversions, \
         lost(f/u) = lost updates fenced/unfenced, del = foreign deletes\n",
    );
    out
}

/// The table as Markdown, for the guide (`docs/chaos.md`).
pub fn markdown(rows: &[Row]) -> String {
    let mut out = format!("| {} |\n", HEADER.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(HEADER.len())));
    for row in rows {
        out.push_str(&format!("| {} |\n", cells(row).join(" | ")));
    }
    out
}
