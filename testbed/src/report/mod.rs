//! Run reports: what one `testbed` run did, measured, broke and verified, and
//! the files written for it under `reports/<run-id>/`.
//!
//! The model ([`RunReport`] and its parts) is plain data with serde derives, so
//! worker processes can send their [`OpStats`] and [`Timeline`] as JSON and the
//! coordinator can merge them. [`write_report`] writes the folder:
//!
//! - `report.json` — every raw figure ([`read_report`] reads it back),
//! - `report.md` — a readable summary with tables (see [`markdown`]),
//! - `latency_cdf.svg` — latency CDF per operation,
//! - `latency_tail.svg` — the tail: complementary CDF on log axes,
//! - `throughput.svg` — ops/s over time with the injected faults marked,
//! - `map_epochs.svg` — each daemon's map epoch over time (runs on etcd).
//!
//! [`summary_table`] gives the per-operation table as aligned plain text for a
//! terminal.

mod epochs;
pub mod histogram;
mod markdown;
mod svg;
mod time;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use epochs::{EpochChange, MAP_EPOCHS_FILE, map_epochs_svg};
pub use histogram::LatencyHistogram;
pub use markdown::{markdown, summary_table};
pub use svg::{latency_cdf_svg, latency_tail_svg, throughput_svg, xy_chart};
pub use time::{format_utc_time_ms, make_run_id};

/// Operation names in the order the tables and plots list them; any other
/// name follows, alphabetically.
pub const OPERATION_ORDER: [&str; 7] = [
    "READ",
    "WRITE",
    "WRITE_PERSIST",
    "FETCH_ADD",
    "COMPARE_SWAP",
    "FLUSH",
    "ATOMIC_WRITE",
];

/// The most mismatch lines a [`Verification`] keeps before summarizing the
/// rest in one `... and N more` line.
pub const MAX_MISMATCHES: usize = 20;

/// The timeline bucket width [`Timeline::default`] uses.
pub const DEFAULT_BUCKET_MS: u64 = 100;

/// Everything one run measured, with enough context to read it later.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's name, also its folder name, e.g. `20261122-021500-demo`
    /// (see [`make_run_id`]).
    pub run_id: String,
    /// The testbed command that ran: `demo`, `run`, `chaos`, …
    pub command: String,
    /// The topology file, or `<embedded configs/default.toml>`.
    pub topology: String,
    /// The workload's name: `mixed`, `ycsb-a`, …
    pub workload: String,
    /// The client ids that ran the workload.
    pub clients: Vec<String>,
    /// When the measured run started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// How long the measured run lasted, in seconds.
    pub duration_s: f64,
    /// Statistics by operation name: `READ`, `WRITE`, `WRITE_PERSIST`,
    /// `FETCH_ADD`, `COMPARE_SWAP`, `FLUSH`, `ATOMIC_WRITE`.
    pub ops: BTreeMap<String, OpStats>,
    /// Completions and errors over time, from the run's start.
    pub timeline: Timeline,
    /// The faults injected, in the order they happened.
    pub faults: Vec<FaultRecord>,
    /// The final read-back check.
    pub verification: Verification,
    /// Free-form lines for the summary.
    pub notes: Vec<String>,
    /// What the RoCEv2 side counted, in lab runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce: Option<RoceCounters>,
    /// What the run was asked to do, beyond the workload and topology.
    #[serde(default)]
    pub parameters: RunParameters,
    /// The command line that runs it again with the same parameters.
    #[serde(default)]
    pub replay: String,
    /// Where the daemons kept their region files.
    #[serde(default)]
    pub data_dir: String,
    /// Whether the region files are still there after the run: a failed run
    /// keeps them, as does one given its data directory.
    #[serde(default)]
    pub data_kept: bool,
    /// Each daemon's map epoch changes as sampled during the run (runs on
    /// etcd; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub map_epochs: Vec<EpochChange>,
    /// The linearizability check of a register workload's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linearizability: Option<crate::linearizability::LinearizabilityReport>,
    /// The serving copies of replicated regions compared after the run
    /// (replicated topologies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<crate::run::replica_copies::ReplicaComparison>,
}

/// What a run was asked to do beyond its workload, topology and clients
/// (which [`RunReport`] names): with them, enough to run it again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunParameters {
    /// Seed of the workload (worker `i` uses `seed + i`) and, for `chaos`,
    /// of the fault plan.
    pub seed: u64,
    /// Seconds of workload asked for.
    pub duration_s: f64,
    /// Value size in bytes.
    pub size: u64,
    /// Operations in flight per client.
    pub depth: usize,
    /// Keys per client asked for.
    pub keys: u64,
    /// Zipfian keys instead of uniform ones.
    pub zipfian: bool,
    /// How many of the topology's clients ran (all when `None`).
    pub clients: Option<usize>,
    /// How hosts were networked: `loopback`, `netns` or `lab`.
    pub net: String,
    /// Whether every connection proved its principal's key.
    pub authenticate: bool,
    /// The chaos scenario the faults were drawn from, for `chaos`.
    pub scenario: Option<String>,
    /// How many faults were planned.
    pub faults_planned: usize,
    /// Where the daemons took their map from, when not the topology file
    /// (`etcd, N member(s)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

/// RoCEv2 counters of a lab run: each fabric device's RoCE ports (summed
/// over ports and queue pairs, as its `/metrics` gave them at the end of
/// the run; a device restarted by a fault counts from its restart) and
/// each guest's rxe0 hardware counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoceCounters {
    /// Device → counter (`packets_received`, `naks_sent`, …) → value.
    pub devices: BTreeMap<String, BTreeMap<String, u64>>,
    /// Client → rxe0 counter (`rcvd_seq_err`, `retry_exceeded_err`, …) → value.
    pub guests: BTreeMap<String, BTreeMap<String, u64>>,
    /// Server in a guest of its own → what it did itself (`operations`,
    /// `cpu_us`, `queue_pairs`), scraped at the end of the run.
    #[serde(default)]
    pub servers: BTreeMap<String, BTreeMap<String, u64>>,
}

impl RunReport {
    /// Operations completed successfully, over every operation kind.
    pub fn ops_total(&self) -> u64 {
        self.ops.values().map(|s| s.count).sum()
    }

    /// Failed operations the application saw, over every operation kind.
    pub fn errors_total(&self) -> u64 {
        self.ops.values().map(|s| s.errors).sum()
    }

    /// Bytes moved (read or written), over every operation kind.
    pub fn bytes_total(&self) -> u64 {
        self.ops.values().map(|s| s.bytes).sum()
    }

    /// Successful operations per second over the whole run (0 when the
    /// duration is not positive).
    pub fn ops_per_s(&self) -> f64 {
        if self.duration_s > 0.0 && self.duration_s.is_finite() {
            self.ops_total() as f64 / self.duration_s
        } else {
            0.0
        }
    }

    /// All operation kinds merged into one [`OpStats`].
    pub fn all_ops(&self) -> OpStats {
        let mut all = OpStats::default();
        for stats in self.ops.values() {
            all.merge(stats);
        }
        all
    }

    /// Merges per-operation statistics (e.g. one worker's) into `ops`.
    pub fn merge_ops(&mut self, ops: &BTreeMap<String, OpStats>) {
        for (name, stats) in ops {
            self.ops.entry(name.clone()).or_default().merge(stats);
        }
    }

    /// The operations in table order: [`OPERATION_ORDER`] first, then any
    /// other name alphabetically.
    pub fn ops_in_order(&self) -> Vec<(&str, &OpStats)> {
        let mut out: Vec<(&str, &OpStats)> = OPERATION_ORDER
            .iter()
            .filter_map(|name| self.ops.get_key_value(*name))
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        out.extend(
            self.ops
                .iter()
                .filter(|(k, _)| !OPERATION_ORDER.contains(&k.as_str()))
                .map(|(k, v)| (k.as_str(), v)),
        );
        out
    }

    /// Sets every fault's `recovery_ms` that is still `None` from the
    /// timeline, by [`Timeline::recovery_after`], and its `stall_ms` that
    /// is still `None`, by [`Timeline::stall_after`].
    pub fn fill_recovery(&mut self) {
        for fault in &mut self.faults {
            if fault.recovery_ms.is_none() {
                fault.recovery_ms = self.timeline.recovery_after(fault.at_s);
            }
            if fault.stall_ms.is_none() {
                fault.stall_ms = self.timeline.stall_after(fault.at_s, fault.recovery_ms);
            }
        }
    }

    /// Fills recovery and stall (see [`RunReport::fill_recovery`]) and adds
    /// one note per fault with [`FaultRecord::describe`], so that notes,
    /// the fault table, the summary and the plot give the same figures.
    pub fn note_faults(&mut self) {
        self.fill_recovery();
        let notes: Vec<String> = self.faults.iter().map(FaultRecord::describe).collect();
        self.notes.extend(notes);
    }
}

/// Statistics of one operation kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// Operations that completed successfully; their latencies are in
    /// `latency`.
    pub count: u64,
    /// Operations that failed visibly to the application.
    pub errors: u64,
    /// Payload bytes moved by the successful operations.
    pub bytes: u64,
    /// Latency of the successful operations, in microseconds.
    pub latency: LatencyHistogram,
}

impl OpStats {
    /// Records one successful operation moving `bytes` that took `latency`.
    pub fn record_ok(&mut self, latency: Duration, bytes: u64) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.latency.record_duration(latency);
    }

    /// Records one failed operation.
    pub fn record_error(&mut self) {
        self.errors += 1;
    }

    /// Adds `other`'s figures to these.
    pub fn merge(&mut self, other: &OpStats) {
        self.count = self.count.saturating_add(other.count);
        self.errors = self.errors.saturating_add(other.errors);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.latency.merge(&other.latency);
    }
}

/// Completions and errors counted per fixed-width time bucket, from the
/// run's start: bucket `i` covers `[i * bucket_ms, (i + 1) * bucket_ms)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Width of one bucket in milliseconds.
    pub bucket_ms: u64,
    /// Successful completions per bucket.
    pub completions: Vec<u64>,
    /// Errors per bucket (may be shorter than `completions`; missing buckets
    /// count as 0).
    pub errors: Vec<u64>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new(DEFAULT_BUCKET_MS)
    }
}

/// A stretch of a [`Timeline`] without any completion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    /// Start of the first empty bucket, in seconds from the run's start.
    pub start_s: f64,
    /// Length of the stretch in milliseconds (whole buckets).
    pub duration_ms: f64,
}

impl Timeline {
    /// An empty timeline with buckets of `bucket_ms` milliseconds (at least 1).
    pub fn new(bucket_ms: u64) -> Self {
        Self {
            bucket_ms: bucket_ms.max(1),
            completions: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn bucket_of(&self, at: Duration) -> usize {
        let ms = at.as_millis() / u128::from(self.bucket_ms.max(1));
        usize::try_from(ms).unwrap_or(usize::MAX)
    }

    fn bump(series: &mut Vec<u64>, bucket: usize, n: u64) {
        if series.len() <= bucket {
            series.resize(bucket + 1, 0);
        }
        series[bucket] = series[bucket].saturating_add(n);
    }

    /// Counts `n` completions at `at` from the run's start.
    pub fn add_completions(&mut self, at: Duration, n: u64) {
        let bucket = self.bucket_of(at);
        Self::bump(&mut self.completions, bucket, n);
    }

    /// Counts `n` errors at `at` from the run's start.
    pub fn add_errors(&mut self, at: Duration, n: u64) {
        let bucket = self.bucket_of(at);
        Self::bump(&mut self.errors, bucket, n);
    }

    /// Counts one completion (`ok`) or one error at `at` from the run's start.
    pub fn record(&mut self, at: Duration, ok: bool) {
        if ok {
            self.add_completions(at, 1);
        } else {
            self.add_errors(at, 1);
        }
    }

    /// Number of buckets (the longer of the two series).
    pub fn len(&self) -> usize {
        self.completions.len().max(self.errors.len())
    }

    /// Whether there are no buckets.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time the buckets cover, in seconds.
    pub fn span_s(&self) -> f64 {
        self.len() as f64 * self.bucket_ms as f64 / 1000.0
    }

    /// Completions in bucket `i` (0 past the end).
    pub fn completions_at(&self, i: usize) -> u64 {
        self.completions.get(i).copied().unwrap_or(0)
    }

    /// Errors in bucket `i` (0 past the end).
    pub fn errors_at(&self, i: usize) -> u64 {
        self.errors.get(i).copied().unwrap_or(0)
    }

    /// Adds `other` bucket by bucket, extending the shorter series. With
    /// different bucket widths, each of `other`'s buckets is added to the
    /// bucket of `self` that contains its start (an empty `self` takes
    /// `other`'s width instead).
    pub fn merge(&mut self, other: &Timeline) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            self.bucket_ms = other.bucket_ms.max(1);
        }
        let ours = self.bucket_ms.max(1);
        let theirs = other.bucket_ms.max(1);
        let target = |i: usize| -> usize {
            if ours == theirs {
                i
            } else {
                let start = i as u128 * u128::from(theirs);
                usize::try_from(start / u128::from(ours)).unwrap_or(usize::MAX)
            }
        };
        for (i, &n) in other.completions.iter().enumerate() {
            Self::bump(&mut self.completions, target(i), n);
        }
        for (i, &n) in other.errors.iter().enumerate() {
            Self::bump(&mut self.errors, target(i), n);
        }
    }

    /// Index of the first bucket that starts at or after `at_s`.
    fn first_bucket_from(&self, at_s: f64) -> usize {
        (ms_of(at_s) / self.bucket_ms.max(1) as f64).ceil() as usize
    }

    /// Index of the bucket that contains `at_s`.
    fn bucket_containing(&self, at_s: f64) -> usize {
        (ms_of(at_s) / self.bucket_ms.max(1) as f64).floor() as usize
    }

    /// Start (in seconds from the run's start) of the first bucket that starts
    /// at or after `at_s` and has a completion.
    pub fn first_completion_after(&self, at_s: f64) -> Option<f64> {
        if at_s.is_nan() {
            return None;
        }
        let from = self.first_bucket_from(at_s);
        (from..self.completions.len())
            .find(|&i| self.completions[i] > 0)
            .map(|i| self.bucket_start_s(i))
    }

    /// The longest run of buckets without a completion, from the bucket that
    /// contains `at_s` to the end (`None` when every bucket has completions).
    pub fn longest_gap_after(&self, at_s: f64) -> Option<Gap> {
        self.longest_gap_between(at_s, self.len())
    }

    /// The stall after a fault at `at_s` that recovered after
    /// `recovery_ms` ([`Timeline::recovery_after`]; `None`: it did not):
    /// the longest run of buckets without a completion from the bucket
    /// that contains the fault to the recovery (to the end when it did
    /// not recover), in milliseconds; 0 when requests never stopped
    /// completing; `None` for a fault at no valid time or past the end of
    /// the data. Resolution: one bucket.
    pub fn stall_after(&self, at_s: f64, recovery_ms: Option<f64>) -> Option<f64> {
        if !at_s.is_finite() || at_s < 0.0 || self.bucket_containing(at_s) >= self.len() {
            return None;
        }
        let end = match recovery_ms {
            Some(ms) => self.bucket_containing(at_s + ms / 1000.0).min(self.len()),
            None => self.len(),
        };
        Some(
            self.longest_gap_between(at_s, end)
                .map_or(0.0, |gap| gap.duration_ms),
        )
    }

    /// The longest run of buckets without a completion among the buckets
    /// from the one that contains `at_s` up to bucket `end` (excluded).
    fn longest_gap_between(&self, at_s: f64, end: usize) -> Option<Gap> {
        if at_s.is_nan() {
            return None;
        }
        let end = end.min(self.len());
        let from = self.bucket_containing(at_s);
        let mut best: Option<(usize, usize)> = None;
        let mut run_start: Option<usize> = None;
        for i in from..=end {
            let empty = i < end && self.completions_at(i) == 0;
            match (empty, run_start) {
                (true, None) => run_start = Some(i),
                (false, Some(start)) => {
                    if best.is_none_or(|(s, e)| i - start > e - s) {
                        best = Some((start, i));
                    }
                    run_start = None;
                }
                _ => {}
            }
        }
        best.map(|(start, end)| Gap {
            start_s: self.bucket_start_s(start),
            duration_ms: ((end - start) as u64 * self.bucket_ms) as f64,
        })
    }

    /// How long after a fault at `at_s` requests flowed again, in
    /// milliseconds: the time from the fault to the start of the first bucket
    /// that starts at or after it and whose completions are back to at least
    /// half the pre-fault average (the mean completions of the whole buckets
    /// before the fault). `None` when there is no pre-fault bucket, the
    /// pre-fault average is 0, or no later bucket reaches the threshold.
    /// Resolution: one bucket.
    pub fn recovery_after(&self, at_s: f64) -> Option<f64> {
        if !at_s.is_finite() || at_s < 0.0 {
            return None;
        }
        let bucket_ms = self.bucket_ms.max(1) as f64;
        let at_ms = ms_of(at_s);
        let before = self.bucket_containing(at_s).min(self.completions.len());
        if before == 0 {
            return None;
        }
        let average = self.completions[..before].iter().sum::<u64>() as f64 / before as f64;
        if average <= 0.0 {
            return None;
        }
        let threshold = average / 2.0;
        let from = self.first_bucket_from(at_s);
        (from..self.completions.len())
            .find(|&i| self.completions[i] as f64 >= threshold)
            .map(|i| (i as f64 * bucket_ms - at_ms).max(0.0))
    }

    fn bucket_start_s(&self, i: usize) -> f64 {
        i as f64 * self.bucket_ms as f64 / 1000.0
    }

    /// The timeline as at most `max_points` points of (middle of the span in
    /// seconds, completions per second, errors per second), summing
    /// consecutive buckets when there are more buckets than points.
    pub fn resample(&self, max_points: usize) -> Vec<(f64, f64, f64)> {
        let n = self.len();
        if n == 0 || max_points == 0 {
            return Vec::new();
        }
        let group = n.div_ceil(max_points);
        let bucket_s = self.bucket_ms.max(1) as f64 / 1000.0;
        (0..n)
            .step_by(group)
            .map(|start| {
                let end = (start + group).min(n);
                let completions: u64 = (start..end).map(|i| self.completions_at(i)).sum();
                let errors: u64 = (start..end).map(|i| self.errors_at(i)).sum();
                let span = (end - start) as f64 * bucket_s;
                (
                    (start + end) as f64 / 2.0 * bucket_s,
                    completions as f64 / span,
                    errors as f64 / span,
                )
            })
            .collect()
    }
}

/// `at_s` in milliseconds, rounded to the microsecond so that decimal
/// seconds such as 2.3 land on the bucket edge they name; negative and NaN
/// count as 0.
fn ms_of(at_s: f64) -> f64 {
    if at_s.is_nan() || at_s <= 0.0 {
        0.0
    } else {
        (at_s * 1e6).round() / 1e3
    }
}

/// One injected fault and what the application saw of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// When the fault was injected, in seconds from the run's start.
    pub at_s: f64,
    /// What was done: `kill-fabric`, `kill-server`, `cut-link`, `restart-all`,
    /// `kill-etcd`, `kill-etcd-leader`.
    pub kind: String,
    /// What it was done to (a fabric device, server or link name).
    pub target: String,
    /// When the target was restarted or the link restored, in seconds from the
    /// run's start.
    pub restored_at_s: Option<f64>,
    /// Time until requests flowed again, in milliseconds (see
    /// [`Timeline::recovery_after`]).
    pub recovery_ms: Option<f64>,
    /// The longest stretch without any completion between the fault and
    /// its recovery, in milliseconds (see [`Timeline::stall_after`]).
    #[serde(default)]
    pub stall_ms: Option<f64>,
    /// Errors the application saw because of this fault.
    pub errors_seen: u64,
}

/// What "recovery" means everywhere a report gives it.
pub const RECOVERY_DEFINITION: &str = "throughput back to at least half its pre-fault average";

impl FaultRecord {
    /// One line about this fault in the words the report uses everywhere:
    /// `kill-server B at 5.000 s: recovery 1057 ms (throughput back to …),
    /// longest stall without any completion 1000 ms, 12 errors seen`.
    pub fn describe(&self) -> String {
        let recovery = match self.recovery_ms.filter(|ms| ms.is_finite()) {
            Some(ms) => format!("recovery {ms:.0} ms ({RECOVERY_DEFINITION})"),
            None => format!(
                "no recovery measured (no {RECOVERY_DEFINITION} before the run ended, or no \
                 throughput before the fault)"
            ),
        };
        let stall = match self.stall_ms.filter(|ms| ms.is_finite()) {
            Some(ms) if ms > 0.0 => format!(", longest stall without any completion {ms:.0} ms"),
            Some(_) => ", requests never stopped completing".to_owned(),
            None => String::new(),
        };
        let name = format!("{} {}", self.kind, self.target);
        format!(
            "{} at {:.3} s: {recovery}{stall}, {} errors seen",
            name.trim(),
            self.at_s,
            self.errors_seen
        )
    }
}

/// The checks of a run: the values read during it, and the final read-back
/// of everything acknowledged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// Keys whose last acknowledged version was read back.
    pub keys_checked: u64,
    /// Counters compared with their number of acknowledged increments.
    pub counters_checked: u64,
    /// The shared counter words' FETCH_ADD tally over every client, and
    /// how much the words grew (checked word by word: each grew by its
    /// acknowledged increments, plus at most those of unknown outcome; an
    /// increment applied twice shows as growth beyond that).
    #[serde(default)]
    pub counter_increments: CounterIncrements,
    /// What the final read-back found wrong, one human-readable line each;
    /// at most [`MAX_MISMATCHES`] lines plus a final `... and N more` (see
    /// [`Verification::push_mismatch`]).
    pub mismatches: Vec<String>,
    /// Whether every check passed, during the run and at the end.
    pub passed: bool,
    /// Reads during the run whose value was judged.
    #[serde(default)]
    pub reads_checked: u64,
    /// Of those, reads that overlapped a write of their key: the contract
    /// lets them see a mix of two versions, so such a mix is not judged.
    #[serde(default)]
    pub reads_overlapped: u64,
    /// Of the overlapped reads, those that did see a mix of two versions.
    #[serde(default)]
    pub reads_torn_by_overlap: u64,
    /// What the checks during the run found wrong (reads no write explains,
    /// compare-and-swaps that found what the model did not expect), capped
    /// like `mismatches` (see [`Verification::push_during_run`]).
    #[serde(default)]
    pub during_run: Vec<String>,
}

/// FETCH_ADDs of 1 on the shared counter words, summed over the words a
/// run checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterIncrements {
    /// Shared counter words checked.
    pub words: u64,
    /// Increments the clients saw acknowledged.
    pub acked: u64,
    /// Increments whose outcome the clients never learned (the operation
    /// failed or timed out): each may or may not have been applied.
    pub uncertain: u64,
    /// How much the words grew from before the workload to the end.
    pub grew: u64,
}

impl Verification {
    /// Adds one line found by the final read-back, keeping at most
    /// [`MAX_MISMATCHES`] lines and counting the rest in a final
    /// `... and N more` line.
    pub fn push_mismatch(&mut self, line: impl Into<String>) {
        push_capped(&mut self.mismatches, line.into());
    }

    /// Adds one line found during the run, capped as
    /// [`Verification::push_mismatch`] caps.
    pub fn push_during_run(&mut self, line: impl Into<String>) {
        push_capped(&mut self.during_run, line.into());
    }

    /// Total mismatches the final read-back found, including those
    /// summarized in the `... and N more` line.
    pub fn mismatch_count(&self) -> u64 {
        capped_count(&self.mismatches)
    }

    /// Total problems found during the run, including those summarized in
    /// the `... and N more` line.
    pub fn during_run_count(&self) -> u64 {
        capped_count(&self.during_run)
    }

    /// Whether no check, during the run or at the end, found anything.
    pub fn is_clean(&self) -> bool {
        self.mismatches.is_empty() && self.during_run.is_empty()
    }

    /// Adds `other`'s counts and lines (each line prefixed with `prefix`,
    /// say a client id), e.g. one worker's into the run's.
    pub fn merge(&mut self, other: &Verification, prefix: &str) {
        self.keys_checked += other.keys_checked;
        self.counters_checked += other.counters_checked;
        self.reads_checked += other.reads_checked;
        self.reads_overlapped += other.reads_overlapped;
        self.reads_torn_by_overlap += other.reads_torn_by_overlap;
        for line in &other.mismatches {
            self.push_mismatch(format!("{prefix}{line}"));
        }
        for line in &other.during_run {
            self.push_during_run(format!("{prefix}{line}"));
        }
    }
}

/// Pushes `line`, keeping at most [`MAX_MISMATCHES`] lines and counting
/// the rest in a final `... and N more` line.
fn push_capped(lines: &mut Vec<String>, line: String) {
    let len = lines.len();
    if len < MAX_MISMATCHES {
        lines.push(line);
    } else if len == MAX_MISMATCHES {
        lines.push(more_line(1));
    } else if let Some(last) = lines.last_mut() {
        let more = parse_more_line(last).unwrap_or(0);
        *last = more_line(more + 1);
    }
}

/// The lines [`push_capped`] kept, counting the summarized ones.
fn capped_count(lines: &[String]) -> u64 {
    match lines.last().and_then(|l| parse_more_line(l)) {
        Some(more) if lines.len() > MAX_MISMATCHES => (lines.len() - 1) as u64 + more,
        _ => lines.len() as u64,
    }
}

fn more_line(n: u64) -> String {
    format!("... and {n} more")
}

fn parse_more_line(line: &str) -> Option<u64> {
    line.strip_prefix("... and ")?
        .strip_suffix(" more")?
        .parse()
        .ok()
}

/// The files [`write_report`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    /// The report's folder.
    pub dir: PathBuf,
    /// `report.json`.
    pub json: PathBuf,
    /// `report.md`.
    pub markdown: PathBuf,
    /// `latency_cdf.svg`.
    pub latency_cdf: PathBuf,
    /// `latency_tail.svg`.
    pub latency_tail: PathBuf,
    /// `throughput.svg`.
    pub throughput: PathBuf,
}

/// A report file that could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The report folder could not be created.
    #[error("cannot create report folder {}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The report could not be turned into JSON, or a file is not a report.
    #[error("invalid report JSON in {}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The JSON file's name inside a report folder.
pub const JSON_FILE: &str = "report.json";
/// The Markdown file's name inside a report folder.
pub const MARKDOWN_FILE: &str = "report.md";
/// The latency CDF plot's name inside a report folder.
pub const LATENCY_CDF_FILE: &str = "latency_cdf.svg";
/// The latency tail plot's name inside a report folder.
pub const LATENCY_TAIL_FILE: &str = "latency_tail.svg";
/// The throughput plot's name inside a report folder.
pub const THROUGHPUT_FILE: &str = "throughput.svg";

/// Creates `dir` (and its parents) and writes `report.json`, `report.md`,
/// `latency_cdf.svg`, `latency_tail.svg` and `throughput.svg` into it.
pub fn write_report(dir: &Path, report: &RunReport) -> Result<ReportFiles, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let files = ReportFiles {
        dir: dir.to_path_buf(),
        json: dir.join(JSON_FILE),
        markdown: dir.join(MARKDOWN_FILE),
        latency_cdf: dir.join(LATENCY_CDF_FILE),
        latency_tail: dir.join(LATENCY_TAIL_FILE),
        throughput: dir.join(THROUGHPUT_FILE),
    };
    let mut json = serde_json::to_string_pretty(report).map_err(|source| ReportError::Json {
        path: files.json.clone(),
        source,
    })?;
    json.push('\n');
    write_file(&files.json, &json)?;
    write_file(&files.markdown, &markdown(report))?;
    write_file(&files.latency_cdf, &latency_cdf_svg(report))?;
    write_file(&files.latency_tail, &latency_tail_svg(report))?;
    write_file(&files.throughput, &throughput_svg(report))?;
    if !report.map_epochs.is_empty() {
        write_file(&dir.join(MAP_EPOCHS_FILE), &map_epochs_svg(report))?;
    }
    Ok(files)
}

/// Reads a `report.json` written by [`write_report`]; `path` may be the file
/// or its folder.
pub fn read_report(path: &Path) -> Result<RunReport, ReportError> {
    let file = if path.is_dir() {
        path.join(JSON_FILE)
    } else {
        path.to_path_buf()
    };
    let text = fs::read_to_string(&file).map_err(|source| ReportError::Read {
        path: file.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ReportError::Json { path: file, source })
}

fn write_file(path: &Path, contents: &str) -> Result<(), ReportError> {
    fs::write(path, contents).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
