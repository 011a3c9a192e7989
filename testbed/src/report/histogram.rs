//! A mergeable latency histogram in microseconds.
//!
//! Log-linear buckets in the manner of HdrHistogram: every value below 128 µs
//! has a bucket of its own; above that, each power of two is split into 64
//! equal sub-buckets, so a bucket is never wider than 1/64 of its lowest value.
//! A quantile is reported as the middle of its bucket, which is within 0.8 % of
//! the true sample — from 1 µs to 100 s and beyond (the whole `u64` range has
//! buckets). The exact minimum and maximum are kept on the side.
//!
//! The serialized form is small and sparse: only non-empty buckets are written,
//! as `[index, count]` pairs, so worker processes can write their histograms
//! into JSON and the coordinator can read and [`merge`](LatencyHistogram::merge)
//! them.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// log2 of the number of linear sub-buckets per power of two.
const SUB_BITS: u32 = 6;
/// Linear sub-buckets per power of two.
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Values below this have one bucket each (exact).
const LINEAR_LIMIT: u64 = 2 << SUB_BITS;
/// The exponent of `LINEAR_LIMIT`: the first power of two split into
/// sub-buckets.
const FIRST_EXP: u32 = SUB_BITS + 1;
/// Number of buckets needed to cover every `u64`.
const NUM_BUCKETS: usize = LINEAR_LIMIT as usize + (64 - FIRST_EXP as usize) * SUB_BUCKETS;

/// The bucket a value falls in.
fn index_of(us: u64) -> usize {
    if us < LINEAR_LIMIT {
        us as usize
    } else {
        let exp = 63 - us.leading_zeros(); // >= FIRST_EXP
        let shift = exp - SUB_BITS;
        let sub = (us >> shift) as usize; // in [SUB_BUCKETS, 2 * SUB_BUCKETS)
        LINEAR_LIMIT as usize + (exp - FIRST_EXP) as usize * SUB_BUCKETS + (sub - SUB_BUCKETS)
    }
}

/// The lowest and highest value (both inclusive) of a bucket.
fn bounds_of(index: usize) -> (u64, u64) {
    if index < LINEAR_LIMIT as usize {
        (index as u64, index as u64)
    } else {
        let j = index - LINEAR_LIMIT as usize;
        let exp = FIRST_EXP + (j / SUB_BUCKETS) as u32;
        let sub = (SUB_BUCKETS + j % SUB_BUCKETS) as u64;
        let shift = exp - SUB_BITS;
        let lo = sub << shift;
        (lo, lo + ((1u64 << shift) - 1))
    }
}

/// The value a bucket stands for in quantiles: its middle.
fn middle_of(index: usize) -> u64 {
    let (lo, hi) = bounds_of(index);
    lo + (hi - lo) / 2
}

/// A latency histogram in microseconds; see the [module docs](self).
///
/// Serializes as `{"count", "min", "max", "sum", "buckets": [[index, count], …]}`
/// (`min` and `max` are 0 when empty).
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "Wire", try_from = "Wire")]
pub struct LatencyHistogram {
    /// Dense counts, grown on demand up to the highest bucket used.
    counts: Vec<u64>,
    count: u64,
    /// `u64::MAX` while empty.
    min: u64,
    max: u64,
    /// Saturating sum of all recorded values, for the mean.
    sum: u64,
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            counts: Vec::new(),
            count: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    /// Records one latency of `us` microseconds.
    pub fn record(&mut self, us: u64) {
        self.record_n(us, 1);
    }

    /// Records `n` latencies of `us` microseconds each.
    pub fn record_n(&mut self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        let index = index_of(us);
        if self.counts.len() <= index {
            self.counts.resize(index + 1, 0);
        }
        self.counts[index] = self.counts[index].saturating_add(n);
        self.count = self.count.saturating_add(n);
        self.min = self.min.min(us);
        self.max = self.max.max(us);
        self.sum = self.sum.saturating_add(us.saturating_mul(n));
    }

    /// Records one latency given as a [`Duration`], rounded to the nearest
    /// microsecond.
    pub fn record_duration(&mut self, latency: Duration) {
        let us = latency.as_nanos().saturating_add(500) / 1000;
        self.record(u64::try_from(us).unwrap_or(u64::MAX));
    }

    /// Adds every sample of `other` to `self`: the result is the same as if
    /// all of them had been recorded here.
    pub fn merge(&mut self, other: &Self) {
        if other.count == 0 {
            return;
        }
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine = mine.saturating_add(*theirs);
        }
        self.count = self.count.saturating_add(other.count);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum = self.sum.saturating_add(other.sum);
    }

    /// Number of recorded samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The smallest recorded value, exactly (0 when empty).
    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    /// The largest recorded value, exactly (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The arithmetic mean in microseconds (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The `q`-quantile in microseconds, `q` in `[0, 1]` (clamped; NaN counts
    /// as 0): the value below or at which a fraction `q` of the samples lie,
    /// within 0.8 %. `quantile(0.0)` is the exact minimum and `quantile(1.0)`
    /// the exact maximum; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        if q == 0.0 {
            return self.min;
        }
        if q == 1.0 {
            return self.max;
        }
        // The rank (1-based) of the sample sought: ceil(q * count).
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(n);
            if n > 0 && seen >= rank {
                return middle_of(index).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// The cumulative distribution as at most `points` pairs of (latency in
    /// µs, fraction of samples at or below it), both non-decreasing; the last
    /// pair is `(max, 1.0)`. Empty when the histogram is empty or `points` is
    /// 0. Each pair is exact at the upper edge of a bucket; when there are
    /// more non-empty buckets than `points`, evenly spaced ones are kept.
    pub fn cdf(&self, points: usize) -> Vec<(f64, f64)> {
        if self.count == 0 || points == 0 {
            return Vec::new();
        }
        let total = self.count as f64;
        let mut all = Vec::new();
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            seen = seen.saturating_add(n);
            let (_, hi) = bounds_of(index);
            let x = hi.clamp(self.min, self.max) as f64;
            all.push((x, (seen as f64 / total).min(1.0)));
        }
        if let Some(last) = all.last_mut() {
            *last = (self.max as f64, 1.0);
        }
        if all.len() <= points {
            return all;
        }
        if points == 1 {
            return all.split_off(all.len() - 1);
        }
        let n = all.len();
        (0..points)
            .map(|i| all[(i * (n - 1) + (points - 1) / 2) / (points - 1)])
            .collect()
    }

    /// The non-empty buckets as (lowest value, highest value, count), in
    /// increasing order.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| {
                let (lo, hi) = bounds_of(i);
                (lo, hi, *n)
            })
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for LatencyHistogram {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count
            && self.min() == other.min()
            && self.max == other.max
            && self.sum == other.sum
            && self.buckets().eq(other.buckets())
    }
}

impl Eq for LatencyHistogram {}

impl fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count)
            .field("min", &self.min())
            .field("max", &self.max)
            .field("mean", &self.mean())
            .field("buckets", &self.buckets().count())
            .finish()
    }
}

/// The serialized form of a [`LatencyHistogram`].
#[derive(Serialize, Deserialize)]
struct Wire {
    count: u64,
    min: u64,
    max: u64,
    sum: u64,
    /// `(bucket index, count)` for every non-empty bucket, increasing index.
    buckets: Vec<(u32, u64)>,
}

impl From<LatencyHistogram> for Wire {
    fn from(h: LatencyHistogram) -> Self {
        let buckets = h
            .counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (i as u32, *n))
            .collect();
        Wire {
            count: h.count,
            min: h.min(),
            max: h.max,
            sum: h.sum,
            buckets,
        }
    }
}

impl TryFrom<Wire> for LatencyHistogram {
    type Error = String;

    fn try_from(wire: Wire) -> Result<Self, String> {
        let mut h = LatencyHistogram::new();
        let mut total = 0u64;
        for &(index, n) in &wire.buckets {
            let index = index as usize;
            if index >= NUM_BUCKETS {
                return Err(format!(
                    "histogram bucket index {index} out of range (max {})",
                    NUM_BUCKETS - 1
                ));
            }
            if h.counts.len() <= index {
                h.counts.resize(index + 1, 0);
            }
            h.counts[index] = h.counts[index].saturating_add(n);
            total = total.saturating_add(n);
        }
        if total != wire.count {
            return Err(format!(
                "histogram count {} does not match its buckets' total {total}",
                wire.count
            ));
        }
        h.count = total;
        if total > 0 {
            if wire.min > wire.max {
                return Err(format!(
                    "histogram min {} is above its max {}",
                    wire.min, wire.max
                ));
            }
            h.min = wire.min;
            h.max = wire.max;
            h.sum = wire.sum;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random generator (SplitMix64).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in [0, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The exact q-quantile of sorted samples, by the same rank rule.
    fn exact_quantile(sorted: &[u64], q: f64) -> u64 {
        let n = sorted.len() as u64;
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        sorted[(rank - 1) as usize]
    }

    const QS: [f64; 12] = [
        0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999,
    ];

    fn check_quantiles(samples: &mut [u64]) {
        let mut h = LatencyHistogram::new();
        for &s in samples.iter() {
            h.record(s);
        }
        samples.sort_unstable();
        assert_eq!(h.count(), samples.len() as u64);
        assert_eq!(h.min(), samples[0]);
        assert_eq!(h.max(), *samples.last().unwrap());
        assert_eq!(h.quantile(0.0), samples[0]);
        assert_eq!(h.quantile(1.0), *samples.last().unwrap());
        for q in QS {
            let exact = exact_quantile(samples, q) as f64;
            let got = h.quantile(q) as f64;
            let err = (got - exact).abs() / exact.max(1.0);
            assert!(
                err <= 0.01,
                "q={q}: got {got}, exact {exact}, error {:.3}%",
                err * 100.0
            );
        }
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / samples.len() as f64;
        assert!((h.mean() - mean).abs() <= mean * 1e-9);
    }

    #[test]
    fn bucket_layout_is_contiguous_and_bounded() {
        // Consecutive buckets tile the u64 range without gaps or overlaps.
        let mut next = 0u64;
        for i in 0..NUM_BUCKETS {
            let (lo, hi) = bounds_of(i);
            assert_eq!(lo, next, "bucket {i}");
            assert!(hi >= lo);
            assert_eq!(index_of(lo), i);
            assert_eq!(index_of(hi), i);
            // No bucket is wider than 1/64 of its lowest value.
            assert!((hi - lo) as f64 <= lo as f64 / 64.0, "bucket {i}");
            next = hi.wrapping_add(1);
        }
        assert_eq!(next, 0, "the last bucket ends at u64::MAX");
        assert_eq!(index_of(u64::MAX), NUM_BUCKETS - 1);
    }

    #[test]
    fn quantiles_uniform_within_one_percent() {
        let mut rng = Rng(1);
        let mut samples: Vec<u64> = (0..200_000).map(|_| 1 + rng.next() % 100_000).collect();
        check_quantiles(&mut samples);
    }

    #[test]
    fn quantiles_log_uniform_1us_to_100s_within_one_percent() {
        let mut rng = Rng(2);
        // log10 uniform in [0, 8]: 1 µs .. 100 s.
        let mut samples: Vec<u64> = (0..200_000)
            .map(|_| 10f64.powf(rng.unit() * 8.0).round() as u64)
            .collect();
        check_quantiles(&mut samples);
    }

    #[test]
    fn quantiles_exponential_tail_within_one_percent() {
        let mut rng = Rng(3);
        // Typical RPC latency: 20 µs floor plus an exponential tail, mean 80 µs.
        let mut samples: Vec<u64> = (0..200_000)
            .map(|_| 20 + (-(1.0 - rng.unit()).ln() * 80.0) as u64)
            .collect();
        check_quantiles(&mut samples);
    }

    #[test]
    fn known_sequence_quantiles() {
        let mut h = LatencyHistogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        // Below 128 µs every value has its own bucket: exact.
        assert_eq!(h.quantile(0.5), 50);
        assert_eq!(h.quantile(0.99), 99);
        assert_eq!(h.quantile(0.999), 100);
        assert_eq!(h.mean(), 50.5);
    }

    #[test]
    fn empty_and_single_value() {
        let h = LatencyHistogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!((h.min(), h.max(), h.quantile(0.5)), (0, 0, 0));
        assert_eq!(h.mean(), 0.0);
        assert!(h.cdf(100).is_empty());

        let mut h = LatencyHistogram::new();
        h.record(123_456);
        for q in [0.0, 0.001, 0.5, 1.0, f64::NAN, -1.0, 2.0] {
            assert_eq!(h.quantile(q), 123_456, "q={q}");
        }
        assert_eq!(h.cdf(10), vec![(123_456.0, 1.0)]);
    }

    #[test]
    fn record_duration_rounds_to_microseconds() {
        let mut h = LatencyHistogram::new();
        h.record_duration(Duration::from_nanos(1_499));
        h.record_duration(Duration::from_nanos(1_500));
        h.record_duration(Duration::from_secs(100));
        h.record_duration(Duration::MAX);
        assert_eq!(h.min(), 1);
        assert_eq!(h.quantile(0.5), 2);
        assert_eq!(h.max(), u64::MAX);
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn merge_equals_recording_everything() {
        let mut rng = Rng(4);
        let samples: Vec<u64> = (0..50_000).map(|_| rng.next() % 10_000_000).collect();
        let mut all = LatencyHistogram::new();
        let mut parts = vec![LatencyHistogram::new(); 3];
        for (i, &s) in samples.iter().enumerate() {
            all.record(s);
            parts[i % 3].record(s);
        }
        let mut merged = LatencyHistogram::new();
        merged.merge(&LatencyHistogram::new());
        for p in &parts {
            merged.merge(p);
        }
        merged.merge(&LatencyHistogram::new());
        assert_eq!(merged, all);
        assert_eq!(merged.min(), all.min());
        assert_eq!(merged.max(), all.max());
        for q in QS {
            assert_eq!(merged.quantile(q), all.quantile(q));
        }
        assert_eq!(merged.cdf(50), all.cdf(50));
    }

    #[test]
    fn serde_round_trip_is_sparse_and_equal() {
        let mut h = LatencyHistogram::new();
        for v in [0, 1, 5, 5, 130, 1_000, 99_999, 100_000_000, u64::MAX] {
            h.record(v);
        }
        let json = serde_json::to_string(&h).unwrap();
        assert!(json.len() < 300, "sparse form expected: {json}");
        let back: LatencyHistogram = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.quantile(0.5), h.quantile(0.5));
        assert_eq!(back.mean(), h.mean());

        let empty: LatencyHistogram =
            serde_json::from_str(&serde_json::to_string(&LatencyHistogram::new()).unwrap())
                .unwrap();
        assert_eq!(empty, LatencyHistogram::new());
        assert_eq!(empty.min(), 0);

        // Inconsistent input is refused rather than silently accepted.
        let bad = r#"{"count":3,"min":1,"max":1,"sum":1,"buckets":[[1,1]]}"#;
        assert!(serde_json::from_str::<LatencyHistogram>(bad).is_err());
        let bad = r#"{"count":1,"min":1,"max":1,"sum":1,"buckets":[[999999,1]]}"#;
        assert!(serde_json::from_str::<LatencyHistogram>(bad).is_err());
    }

    #[test]
    fn cdf_is_monotone_bounded_and_ends_at_max() {
        let mut rng = Rng(5);
        let mut h = LatencyHistogram::new();
        for _ in 0..100_000 {
            h.record(10f64.powf(rng.unit() * 6.0) as u64);
        }
        for points in [1, 2, 7, 100, 10_000] {
            let cdf = h.cdf(points);
            assert!(!cdf.is_empty() && cdf.len() <= points, "points={points}");
            assert_eq!(*cdf.last().unwrap(), (h.max() as f64, 1.0));
            for w in cdf.windows(2) {
                assert!(w[0].0 <= w[1].0 && w[0].1 <= w[1].1, "{w:?}");
            }
            for &(x, f) in &cdf {
                assert!(x >= h.min() as f64 && x <= h.max() as f64);
                assert!(f > 0.0 && f <= 1.0);
            }
        }
        // The fraction at a point matches the quantile at that fraction.
        let cdf = h.cdf(10_000);
        let (x, f) = cdf[cdf.len() / 2];
        let q = h.quantile(f) as f64;
        assert!((q - x).abs() <= x / 64.0, "x={x} q={q}");
        assert!(h.cdf(0).is_empty());
    }
}
