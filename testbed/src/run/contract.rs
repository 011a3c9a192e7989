//! What a run must hold, checked after it: the fabric's contract over the
//! report, and the shared counters against the increments acknowledged.

use std::collections::BTreeMap;

use crate::fabric::launch::Fabric;
use crate::report::{RunReport, Verification};
use crate::workload::CounterTally;
use crate::workload::keys::counter_word;

use super::faults::FaultKind;

/// Where a run broke the fabric's contract: faults of a fabric device must
/// be invisible to the application (another path exists), a read must see
/// a version that was written (a mix of two only while a write of its key
/// overlapped it), and nothing acknowledged may be lost (the final
/// verification).
pub fn contract_violations(report: &RunReport) -> Vec<String> {
    let mut violations = Vec::new();
    for fault in &report.faults {
        let kind = FaultKind::from_name(&fault.kind);
        if kind.is_some_and(FaultKind::invisible) && fault.errors_seen > 0 {
            let why = match kind {
                Some(FaultKind::KillEtcd | FaultKind::KillEtcdLeader) => {
                    "although only the control plane was down"
                }
                _ => "although another path existed",
            };
            violations.push(format!(
                "{} {} at {:.2} s: the application saw {} errors {why}",
                fault.kind, fault.target, fault.at_s, fault.errors_seen
            ));
        }
    }
    if let Some(check) = &report.linearizability
        && !check.passed
    {
        violations.push(format!("linearizability {}", check.summary()));
    }
    let v = &report.verification;
    if !v.during_run.is_empty() {
        violations.push(format!(
            "during the run, {} found a value no write explains (reads with no write of \
             their key overlapping them, compare-and-swaps on a worker's own words)",
            plural(v.during_run_count(), "check", "checks")
        ));
    }
    if !v.mismatches.is_empty() {
        violations.push(format!(
            "the final verification found {} with acknowledged data (missing, wrong or not \
             checked)",
            plural(v.mismatch_count(), "problem", "problems")
        ));
    } else if !v.passed && v.during_run.is_empty() {
        violations.push("the verification failed".to_owned());
    }
    if let Some(replicas) = &report.replicas {
        for line in &replicas.differences {
            violations.push(format!("replicas diverged: {line}"));
        }
    }
    violations
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The counter words in `bytes` (little-endian `u64`s).
pub(super) fn counter_values(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect()
}

/// Compares how much every shared counter word (of the space at `base`)
/// grew since `before` with the increments the workers saw acknowledged
/// (plus those that failed visibly and may have applied).
pub(super) fn check_counters(
    fabric: &Fabric,
    client: &str,
    (base, before): (u64, &[u64]),
    counters: &BTreeMap<u64, CounterTally>,
    verification: &mut Verification,
) {
    if counters.is_empty() {
        return;
    }
    let words: Vec<(u64, CounterTally)> = counters.iter().map(|(w, t)| (*w, *t)).collect();
    let values = fabric.as_client(client, |pool| async move {
        let mut out = Vec::new();
        for (w, tally) in words {
            let value = pool
                .fetch_add(counter_word(base, w), 0)
                .await
                .map_err(|e| pmem_client::error_chain(&e))?;
            out.push((w, tally, value));
        }
        Ok(out)
    });
    match values {
        Err(why) => verification.push_mismatch(format!("cannot read the counters: {why}")),
        Ok(values) => {
            for (w, tally, value) in values {
                verification.counters_checked += 1;
                let start = before.get(w as usize).copied().unwrap_or(0);
                let grew = value.wrapping_sub(start);
                let sums = &mut verification.counter_increments;
                sums.words += 1;
                sums.acked += tally.acked;
                sums.uncertain += tally.uncertain;
                sums.grew = sums.grew.wrapping_add(grew);
                if grew < tally.acked || grew > tally.acked + tally.uncertain {
                    verification.push_mismatch(format!(
                        "counter {w}: grew by {grew} (from {start} to {value}), but {} increments \
                         were acknowledged ({} uncertain)",
                        tally.acked, tally.uncertain
                    ));
                }
            }
        }
    }
}
