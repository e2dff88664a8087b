//! `report.html`: the run's report for a browser, beside `report.md` (the same figures),
//! with the SVG charts written next to it. No script, no external asset.

use std::fmt::Write as _;

use super::plan::Scope;
use super::report::Outcome;

/// The whole page.
pub fn page(outcome: &Outcome) -> String {
    let env = &outcome.environment;
    let mut out = String::new();
    let scope = match env.scope {
        Scope::Quick => "the headline rows (the default; <code>--full</code> runs every cell)",
        Scope::Full => "every cell and bar (<code>--full</code>)",
    };
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>fencelock bench report</title>\n<style>{STYLE}</style></head><body>\n\
         <h1>fencelock bench report</h1>\n<p>This run: {scope}. Every backend runs through \
         the same lock trait; each ratio compares cells of this run only, {} s each.</p>\n",
        env.cell_duration_s
    );
    let _ = writeln!(
        out,
        "<p>Servers: {}. {}. {} CPUs, {}.</p>",
        escape(&versions(outcome)),
        escape(&env.fsync),
        env.cpus,
        escape(&env.os)
    );
    let _ = writeln!(
        out,
        "<h2>Performance bars</h2>\n<table><tr><th>bar</th><th>measured</th><th>holds</th></tr>"
    );
    for b in &outcome.bars {
        let (class, word) = if b.holds {
            ("holds", "yes")
        } else {
            ("missed", "no")
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{word}</td></tr>",
            escape(&b.bar),
            escape(&b.measured)
        );
    }
    let _ = writeln!(out, "</table>\n<h2>Charts</h2>");
    for (file, alt) in [
        (
            "ratios.svg",
            "each lock against its peer, cycles per second",
        ),
        ("throughput.svg", "cycles per second by concurrency"),
        ("latency-p50.svg", "p50 latency by concurrency"),
        ("latency-p99.svg", "p99 latency by concurrency"),
        ("handoff.svg", "handoff latency by waiters"),
    ] {
        let _ = writeln!(out, "<p><img src=\"{file}\" alt=\"{alt}\"></p>");
    }
    let _ = writeln!(
        out,
        "<h2>Ratios (same run)</h2>\n<table><tr><th>ratio</th><th>value</th></tr>"
    );
    for r in &outcome.ratios {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{:.2}</td></tr>",
            escape(&r.what),
            r.value
        );
    }
    let _ = writeln!(out, "</table>\n<h2>All cells</h2>\n<table><tr>");
    for head in [
        "workload", "subject", "conc", "ops/s", "p50 us", "p90 us", "p99 us", "max us", "errors",
    ] {
        let _ = write!(out, "<th>{head}</th>");
    }
    let _ = writeln!(out, "</tr>");
    for c in &outcome.cells {
        let _ = write!(out, "<tr>");
        for (i, column) in c.columns().iter().enumerate() {
            let class = if i >= 2 { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", escape(column));
        }
        let _ = writeln!(out, "</tr>");
    }
    let _ = writeln!(out, "</table>");
    if !outcome.renewals.is_empty() {
        let _ = writeln!(
            out,
            "<h2>Renewal traffic</h2>\n<table><tr><th>backend</th><th>locks held</th>\
             <th>seconds</th><th>requests</th><th>per second</th><th>what was counted</th>\
             <th>resident bytes per held lock</th></tr>"
        );
        for r in &outcome.renewals {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td>\
                 <td class=\"n\">{:.0}</td><td class=\"n\">{:.2}</td><td>{}</td>\
                 <td class=\"n\">{}</td></tr>",
                escape(&r.subject),
                r.locks,
                r.seconds,
                r.requests,
                r.requests_per_second,
                escape(&r.note),
                r.resident_bytes_per_lock
                    .map_or_else(|| "n/a".to_owned(), |b| format!("{b:.0}"))
            );
        }
        let _ = writeln!(out, "</table>");
    }
    let _ = writeln!(
        out,
        "<p>The Redis token is a counter that can repeat after a failover, and Redlock's is \
         the largest of independent counters; only etcd's create revision is a fencing token \
         storage can fully rely on (see docs/redis.md).</p>\n\
         <details><summary>Environment (JSON)</summary><pre>{}</pre></details>\n</body></html>",
        escape(&serde_json::to_string_pretty(env).unwrap_or_default())
    );
    out
}

/// The versions the servers reported, those used only.
fn versions(outcome: &Outcome) -> String {
    let env = &outcome.environment;
    let mut used: Vec<String> = [
        &env.etcd,
        &env.redis,
        &env.postgres,
        &env.mariadb,
        &env.zookeeper,
    ]
    .into_iter()
    .filter(|v| *v != "not used")
    .cloned()
    .collect();
    if env.go_peer != "not used" {
        used.push(format!("the Go peer: {}", env.go_peer));
    }
    used.join(", ")
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1150px;margin:2em auto;padding:0 1em}\
    table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;\
    padding:3px 8px;text-align:left}td.n{text-align:right}td.holds{color:#2c7a2c}\
    td.missed{color:#c03020;font-weight:bold}img{max-width:100%}";

/// Text made safe inside HTML (the bars say `>=` and `<=`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn bars_are_escaped() {
        assert_eq!(
            escape("p99 <= 10 ms & >= 1.0x \"Go\""),
            "p99 &lt;= 10 ms &amp; &gt;= 1.0x &quot;Go&quot;"
        );
    }
}
