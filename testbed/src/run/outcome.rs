//! What a run produced, and the summary `run`, `demo` and `chaos` print.

use std::fmt::Write as _;

use crate::fabric::launch::Endpoint;
use crate::report::{ReportFiles, RunReport};

/// What a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// The report.
    pub report: RunReport,
    /// Where it was written.
    pub files: ReportFiles,
    /// The daemons' addresses while it ran.
    pub endpoints: Vec<Endpoint>,
    /// Daemons that did not exit cleanly at the end.
    pub unclean_exits: Vec<String>,
}

impl RunOutcome {
    /// What `run`, `demo` and `chaos` print at the end.
    pub fn summary(&self) -> String {
        let outcome = self;
        let report = &outcome.report;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n{} ({} workload, {} clients, {:.1} s)",
            report.run_id,
            report.workload,
            report.clients.len(),
            report.duration_s
        );
        let _ = writeln!(
            out,
            "  operations      {} ({:.0} ops/s)",
            report.ops_total(),
            report.ops_per_s()
        );
        let _ = writeln!(
            out,
            "  errors seen     {} (by the application)",
            report.errors_total()
        );
        for fault in &report.faults {
            let _ = writeln!(out, "  fault           {}", fault.describe());
        }
        let v = &report.verification;
        let _ = writeln!(
            out,
            "  verification    {} ({} keys, {} counters checked at the end)",
            if v.passed { "PASSED" } else { "FAILED" },
            v.keys_checked,
            v.counters_checked
        );
        let c = &v.counter_increments;
        if c.words > 0 {
            let _ = writeln!(
                out,
                "  counters        grew by {} over {} shared words; {} FETCH_ADDs of 1 \
                 acknowledged, {} of unknown outcome",
                c.grew, c.words, c.acked, c.uncertain
            );
        }
        let _ = writeln!(
            out,
            "  reads checked   {} during the run; {} overlapped a write of their key, {} of them \
             saw a mix of two versions (the contract allows it; not judged)",
            v.reads_checked, v.reads_overlapped, v.reads_torn_by_overlap
        );
        for line in &v.during_run {
            let _ = writeln!(out, "    during the run: {line}");
        }
        for line in &v.mismatches {
            let _ = writeln!(out, "    at the final verification: {line}");
        }
        if let Some(check) = &report.linearizability {
            let _ = writeln!(out, "  linearizability {}", check.summary());
            for line in &check.failure {
                let _ = writeln!(out, "    {line}");
            }
        }
        if let Some(replicas) = &report.replicas {
            let _ = writeln!(out, "  replicas        {}", replicas.summary());
            for line in replicas.differences.iter().chain(&replicas.not_compared) {
                let _ = writeln!(out, "    {line}");
            }
        }
        let _ = writeln!(out, "\n{}", crate::report::summary_table(report));
        let _ = writeln!(
            out,
            "  report          {}",
            outcome.files.markdown.display()
        );
        let _ = writeln!(
            out,
            "  plots           {}, {}, {}",
            outcome.files.latency_cdf.display(),
            outcome.files.latency_tail.display(),
            outcome.files.throughput.display()
        );
        let _ = writeln!(out, "  raw figures     {}", outcome.files.json.display());
        let _ = writeln!(out, "  replay          {}", report.replay);
        let _ = writeln!(
            out,
            "  region files    {}",
            if report.data_kept {
                format!("kept in {}", report.data_dir)
            } else {
                "removed (the run passed)".to_owned()
            }
        );
        // The daemons have stopped: their /metrics addresses were printed
        // while they were live, at the start.
        for line in &outcome.unclean_exits {
            let _ = writeln!(out, "  did not stop cleanly: {line}");
        }
        out
    }
}
