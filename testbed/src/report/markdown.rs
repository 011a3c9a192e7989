//! `report.md` and the plain-text summary table.

use std::fmt::Write as _;

use super::time::format_utc;
use super::{
    LATENCY_CDF_FILE, LATENCY_TAIL_FILE, OpStats, RECOVERY_DEFINITION, RunReport, THROUGHPUT_FILE,
    Verification,
};

/// Column headers of the per-operation table.
const OP_COLUMNS: [&str; 8] = [
    "operation",
    "count",
    "errors",
    "p50 µs",
    "p99 µs",
    "p99.9 µs",
    "max µs",
    "MB moved",
];

/// One row of the per-operation table; latency cells are `None` without
/// samples.
fn op_row(name: &str, stats: &OpStats) -> [Option<String>; 8] {
    let h = &stats.latency;
    let latency = |v: u64| (!h.is_empty()).then(|| v.to_string());
    [
        Some(name.to_owned()),
        Some(stats.count.to_string()),
        Some(stats.errors.to_string()),
        latency(h.quantile(0.5)),
        latency(h.quantile(0.99)),
        latency(h.quantile(0.999)),
        latency(h.max()),
        Some(format!("{:.2}", stats.bytes as f64 / 1e6)),
    ]
}

/// The per-operation rows, in table order, with an `all` row when there is
/// more than one operation.
fn op_rows(report: &RunReport) -> Vec<[Option<String>; 8]> {
    let ops = report.ops_in_order();
    let mut rows: Vec<_> = ops.iter().map(|(name, s)| op_row(name, s)).collect();
    if ops.len() > 1 {
        rows.push(op_row("all", &report.all_ops()));
    }
    rows
}

/// The per-operation table (count, errors, p50, p99, p99.9 and max latency in
/// µs, MB moved) as aligned plain text for a terminal, one line per
/// operation plus an `all` line, each ending in a newline.
pub fn summary_table(report: &RunReport) -> String {
    let mut rows: Vec<Vec<String>> = vec![OP_COLUMNS.iter().map(|s| s.to_string()).collect()];
    let data = op_rows(report);
    if data.is_empty() {
        return "  (no operations recorded)\n".to_owned();
    }
    rows.extend(data.into_iter().map(|r| {
        r.into_iter()
            .map(|c| c.unwrap_or_else(|| "-".to_owned()))
            .collect()
    }));
    let widths: Vec<usize> = (0..OP_COLUMNS.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| {
                let pad = w - cell.chars().count();
                if c == 0 {
                    format!("{cell}{}", " ".repeat(pad))
                } else {
                    format!("{}{cell}", " ".repeat(pad))
                }
            })
            .collect();
        let _ = writeln!(out, "  {}", cells.join("  ").trim_end());
    }
    out
}

/// Text for a Markdown table cell: no line breaks, `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\r', '\n'], " ")
}

/// `text` as an inline code span (safe for `<`, `*`, `_` …).
fn code(text: &str) -> String {
    let text = text.replace(['\r', '\n'], " ");
    let longest_run = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    if longest_run > 0 {
        format!("{fence} {text} {fence}")
    } else {
        format!("{fence}{text}{fence}")
    }
}

/// Free text for Markdown prose: HTML-like text kept visible.
fn prose(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "—".to_owned(),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A Markdown table; columns whose header is in `left` are left-aligned, the
/// others (numbers) right-aligned.
fn table(out: &mut String, headers: &[&str], left: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let align: Vec<&str> = headers
        .iter()
        .map(|h| if left.contains(h) { "---" } else { "---:" })
        .collect();
    let _ = writeln!(out, "|{}|", align.join("|"));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
}

/// The whole `report.md`: title, summary paragraph, per-operation table,
/// faults, verification, notes and the plots.
pub fn markdown(report: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Run report {}\n", code(&report.run_id));
    summary_paragraph(&mut out, report);

    let _ = writeln!(out, "\n## Operations\n");
    let rows = op_rows(report);
    if rows.is_empty() {
        let _ = writeln!(out, "No operations were recorded.");
    } else {
        let rows: Vec<Vec<String>> = rows
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .enumerate()
                    .map(|(i, c)| match (i, c) {
                        (0, Some(name)) => code(&cell(&name)),
                        (_, Some(c)) => c,
                        (_, None) => "—".to_owned(),
                    })
                    .collect()
            })
            .collect();
        table(&mut out, &OP_COLUMNS, &["operation"], &rows);
        let _ = writeln!(
            out,
            "\nLatencies of successful operations; quantiles and max exact below 2048 µs, within 0.1 % above. MB = 10⁶ bytes."
        );
    }

    let _ = writeln!(out, "\n## Faults\n");
    if report.faults.is_empty() {
        let _ = writeln!(out, "No faults were injected.");
    } else {
        let rows: Vec<Vec<String>> = report
            .faults
            .iter()
            .enumerate()
            .map(|(i, f)| {
                vec![
                    (i + 1).to_string(),
                    opt(Some(f.at_s), 2),
                    code(&cell(&f.kind)),
                    code(&cell(&f.target)),
                    opt(f.restored_at_s, 2),
                    opt(f.recovery_ms, 0),
                    opt(f.stall_ms, 0),
                    f.errors_seen.to_string(),
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "#",
                "at (s)",
                "kind",
                "target",
                "restored at (s)",
                "recovery (ms)",
                "longest stall (ms)",
                "errors seen",
            ],
            &["kind", "target"],
            &rows,
        );
        let _ = writeln!(
            out,
            "\nRecovery: time from the fault until a timeline bucket ({} ms) first had at least half the pre-fault average completions ({RECOVERY_DEFINITION}); the notes, the summary and the throughput plot give the same figure. Longest stall: the longest stretch without any completion between the fault and its recovery (to the end of the run when it did not recover).",
            report.timeline.bucket_ms
        );
    }
    if let Some(gap) = report.timeline.longest_gap_after(0.0) {
        let _ = writeln!(
            out,
            "\nLongest stretch without any completion: {:.0} ms from {:.2} s.",
            gap.duration_ms, gap.start_s
        );
    }

    super::epochs::epochs_section(&mut out, report);

    let _ = writeln!(out, "\n## Verification\n");
    verification_section(&mut out, &report.verification);
    if let Some(check) = &report.linearizability {
        let _ = writeln!(out, "\n## Linearizability\n");
        let _ = writeln!(
            out,
            "{} (stateright's `LinearizabilityTester`, each hot word alone; an operation of \
             unknown outcome may take effect at any point after its invocation, or never).",
            prose(&check.summary())
        );
        if !check.failure.is_empty() {
            let _ = writeln!(out, "\n```text");
            for line in &check.failure {
                let _ = writeln!(out, "{}", line.replace('`', "'"));
            }
            let _ = writeln!(out, "```");
        }
    }

    if let Some(replicas) = &report.replicas {
        let _ = writeln!(out, "\n## Replicas\n");
        let _ = writeln!(
            out,
            "Serving copies of every replicated region, compared byte for byte after the run: \
             {}.",
            prose(&replicas.summary())
        );
        for line in replicas.differences.iter().chain(&replicas.not_compared) {
            let _ = writeln!(out, "- {}", prose(line));
        }
    }

    let _ = writeln!(out, "\n## Parameters\n");
    replay_section(&mut out, report);

    if !report.notes.is_empty() {
        let _ = writeln!(out, "\n## Notes\n");
        for note in &report.notes {
            let _ = writeln!(out, "- {}", prose(&note.replace(['\r', '\n'], " ")));
        }
    }

    let _ = writeln!(out, "\n## Plots\n");
    let _ = writeln!(
        out,
        "- [Latency CDF per operation]({LATENCY_CDF_FILE})\n- [Latency tail per operation (complementary CDF, log axes)]({LATENCY_TAIL_FILE})\n- [Throughput over time]({THROUGHPUT_FILE})\n"
    );
    let _ = writeln!(out, "![Latency CDF per operation]({LATENCY_CDF_FILE})\n");
    let _ = writeln!(out, "![Latency tail per operation]({LATENCY_TAIL_FILE})\n");
    let _ = writeln!(out, "![Throughput over time]({THROUGHPUT_FILE})");
    out
}

fn summary_paragraph(out: &mut String, report: &RunReport) {
    let clients = if report.clients.is_empty() {
        "no clients".to_owned()
    } else {
        format!(
            "{} ({})",
            plural(report.clients.len() as u64, "client", "clients"),
            report
                .clients
                .iter()
                .map(|c| code(c))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let verdict = if report.verification.passed {
        "**PASSED**"
    } else {
        "**FAILED**"
    };
    let _ = writeln!(
        out,
        "`testbed {}` ran workload {} on {} with {} for {:.1} s, starting {}. \
         It completed {} ({:.0} ops/s, {:.2} MB moved); the application saw {}. \
         {} injected. Verification {verdict}: {} and {} checked, {}.",
        prose(&report.command.replace(['\r', '\n'], " ")),
        code(&report.workload),
        code(&report.topology),
        clients,
        finite_or_zero(report.duration_s),
        format_utc(report.started_unix_ms),
        plural(report.ops_total(), "operation", "operations"),
        report.ops_per_s(),
        report.bytes_total() as f64 / 1e6,
        plural(report.errors_total(), "error", "errors"),
        capitalize(&plural(
            report.faults.len() as u64,
            "fault was",
            "faults were"
        )),
        plural(report.verification.keys_checked, "key", "keys"),
        plural(report.verification.counters_checked, "counter", "counters"),
        plural(
            report.verification.mismatch_count(),
            "mismatch",
            "mismatches"
        ),
    );
    if let Some(worst) = report
        .faults
        .iter()
        .filter_map(|f| f.recovery_ms)
        .filter(|r| r.is_finite())
        .reduce(f64::max)
    {
        let _ = writeln!(out, "\nSlowest recovery after a fault: {worst:.0} ms.");
    }
}

fn verification_section(out: &mut String, v: &Verification) {
    let _ = writeln!(
        out,
        "- result: {}\n- keys checked at the end: {}\n- counters checked at the end: {}\n\
         - mismatches at the end: {}\n- reads checked during the run: {}\n\
         - of them, overlapping a write of their key: {} ({} saw a mix of two versions, which \
         the contract allows; not judged)\n- problems found during the run: {}",
        if v.passed { "**PASSED**" } else { "**FAILED**" },
        v.keys_checked,
        v.counters_checked,
        v.mismatch_count(),
        v.reads_checked,
        v.reads_overlapped,
        v.reads_torn_by_overlap,
        v.during_run_count(),
    );
    let c = &v.counter_increments;
    if c.words > 0 {
        let _ = writeln!(
            out,
            "- shared counter words: {} checked; they grew by {}, against {} FETCH_ADDs of 1 \
             acknowledged and {} of unknown outcome",
            c.words, c.grew, c.acked, c.uncertain
        );
    }
    for (title, lines) in [
        ("During the run", &v.during_run),
        ("At the final verification", &v.mismatches),
    ] {
        if lines.is_empty() {
            continue;
        }
        let longest_run = lines
            .iter()
            .flat_map(|m| m.split(|c| c != '`').map(str::len))
            .max()
            .unwrap_or(0);
        let fence = "`".repeat(longest_run.max(2) + 1);
        let _ = writeln!(out, "\n{title}:\n\n{fence}text");
        for m in lines {
            let _ = writeln!(out, "{}", m.replace(['\r', '\n'], " "));
        }
        let _ = writeln!(out, "{fence}");
    }
}

/// What the run was asked to do, how to run it again, and where its region
/// files are.
fn replay_section(out: &mut String, report: &RunReport) {
    let p = &report.parameters;
    let _ = writeln!(
        out,
        "- seed: {}\n- duration asked: {} s\n- value size: {} B\n- depth: {}\n- keys per client: \
         {}\n- key choice: {}\n- clients: {}\n- net: {}\n- authentication: {}\n- faults planned: {}{}",
        p.seed,
        p.duration_s,
        p.size,
        p.depth,
        p.keys,
        if p.zipfian { "zipfian" } else { "uniform" },
        p.clients
            .map_or_else(|| "all".to_owned(), |n| n.to_string()),
        code(&p.net),
        if p.authenticate { "on" } else { "off" },
        p.faults_planned,
        p.scenario
            .as_deref()
            .map_or_else(String::new, |s| format!(" (scenario {})", code(s))),
    );
    if let Some(control) = &p.control {
        let _ = writeln!(out, "- map from: {control}");
    }
    if !report.replay.is_empty() {
        let fence = "`".repeat(
            report
                .replay
                .split(|c| c != '`')
                .map(str::len)
                .max()
                .unwrap_or(0)
                .max(2)
                + 1,
        );
        let _ = writeln!(
            out,
            "\nTo run it again:\n\n{fence}sh\n{}\n{fence}",
            report.replay
        );
    }
    if !report.data_dir.is_empty() {
        let _ = writeln!(
            out,
            "\nRegion files: {}.",
            if report.data_kept {
                format!("kept in {}", code(&report.data_dir))
            } else {
                "removed (the run passed)".to_owned()
            }
        );
    }
}

fn finite_or_zero(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
