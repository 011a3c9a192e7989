//! Metric values updated on the hot path: relaxed atomics, no locks.
//!
//! [`Counter`], [`Gauge`] and [`GaugeF64`] wrap the `prometheus-client` types
//! of the same kind. [`Histogram`] is this crate's own, since the
//! `prometheus-client` histogram takes a mutex on every observation; it is
//! encoded through `prometheus-client` all the same.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric, counter, gauge};

use crate::error::RegistryError;

pub(crate) mod sealed {
    /// Keeps [`Metric`](super::Metric) implemented by this crate's types only.
    pub trait Sealed {}
}

/// A value a [`Registry`](crate::Registry) can expose, alone or as the children of
/// a [`Family`](crate::Family): [`Counter`], [`Gauge`], [`GaugeF64`], [`Histogram`].
///
/// Clones share one value, as in `prometheus-client`.
pub trait Metric:
    sealed::Sealed + EncodeMetric + TypedMetric + Clone + fmt::Debug + Send + Sync + 'static
{
}

/// Implements the `prometheus-client` metric traits of a wrapper by
/// delegating to the wrapped value.
macro_rules! delegate_metric {
    ($wrapper:ty, $kind:expr) => {
        impl TypedMetric for $wrapper {
            const TYPE: MetricType = $kind;
        }

        impl EncodeMetric for $wrapper {
            fn encode(&self, encoder: MetricEncoder<'_>) -> fmt::Result {
                self.0.encode(encoder)
            }

            fn metric_type(&self) -> MetricType {
                $kind
            }
        }

        impl sealed::Sealed for $wrapper {}
        impl Metric for $wrapper {}
    };
}

/// A count that only goes up: operations served, bytes written.
#[derive(Debug, Clone, Default)]
pub struct Counter(counter::Counter<u64, AtomicU64>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.0.inc();
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

delegate_metric!(Counter, MetricType::Counter);

/// An integer that goes up and down: requests in flight, connected peers.
#[derive(Debug, Clone, Default)]
pub struct Gauge(gauge::Gauge<i64, AtomicI64>);

impl Gauge {
    /// A gauge at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the value.
    #[inline]
    pub fn set(&self, value: i64) {
        self.0.set(value);
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.0.inc();
    }

    /// Subtracts one.
    #[inline]
    pub fn dec(&self) {
        self.0.dec();
    }

    /// Adds `delta`, which may be negative.
    #[inline]
    pub fn add(&self, delta: i64) {
        self.0.inc_by(delta);
    }

    /// Subtracts `delta`.
    #[inline]
    pub fn sub(&self, delta: i64) {
        self.0.dec_by(delta);
    }

    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.get()
    }
}

delegate_metric!(Gauge, MetricType::Gauge);

/// A floating-point gauge (a ratio, a temperature), kept as the bits of an `f64`
/// in an `AtomicU64`; `add` is a compare-and-swap loop.
#[derive(Debug, Clone, Default)]
pub struct GaugeF64(gauge::Gauge<f64, AtomicU64>);

impl GaugeF64 {
    /// A gauge at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the value.
    #[inline]
    pub fn set(&self, value: f64) {
        self.0.set(value);
    }

    /// Adds `delta`, which may be negative.
    #[inline]
    pub fn add(&self, delta: f64) {
        self.0.inc_by(delta);
    }

    /// Subtracts `delta`.
    #[inline]
    pub fn sub(&self, delta: f64) {
        self.0.dec_by(delta);
    }

    /// The current value.
    pub fn get(&self) -> f64 {
        self.0.get()
    }
}

delegate_metric!(GaugeF64, MetricType::Gauge);

/// Upper bounds, in seconds, from 1 µs to 10 s: 1, 2.5 and 5 in every decade.
const LATENCY_BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A distribution of observations into buckets with fixed upper bounds, chosen
/// when it is created. Each observation is one `fetch_add` on its bucket and a
/// compare-and-swap loop on the sum. The count is the buckets' total, so a
/// scrape always sees `+Inf` equal to `_count`. Clones share the buckets.
#[derive(Debug, Clone)]
pub struct Histogram(Arc<Buckets>);

#[derive(Debug)]
struct Buckets {
    /// Finite, strictly increasing upper bounds; `+Inf` is implicit.
    bounds: Arc<[f64]>,
    /// One counter per bound, then one for values above the last bound.
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds: finite and strictly increasing, an
    /// optional trailing `+Inf` (always added) allowed. No bounds at all is fine:
    /// only `+Inf` then.
    pub fn new(bounds: &[f64]) -> Result<Self, RegistryError> {
        Ok(Self::with_bounds(Self::checked_bounds(bounds)?))
    }

    /// Latency bounds in seconds, 1 µs to 10 s, exponential at 1, 2.5 and 5 per
    /// decade (22 buckets plus `+Inf`).
    pub fn latency_buckets() -> &'static [f64] {
        &LATENCY_BUCKETS
    }

    /// `count` bounds `start`, `start * factor`, `start * factor²`, …; e.g. request
    /// sizes with `exponential_buckets(512.0, 2.0, 12)`. Bounds that are not
    /// increasing (`start <= 0` or `factor <= 1`) are refused when the histogram
    /// is created.
    pub fn exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
        std::iter::successors(Some(start), |bound| Some(bound * factor))
            .take(count)
            .collect()
    }

    pub(crate) fn checked_bounds(bounds: &[f64]) -> Result<Arc<[f64]>, RegistryError> {
        let finite = match bounds.split_last() {
            Some((last, rest)) if *last == f64::INFINITY => rest,
            _ => bounds,
        };
        if finite.iter().any(|bound| !bound.is_finite()) {
            return Err(RegistryError::InvalidBuckets(
                "bounds must be finite numbers (a trailing +Inf is implied)",
            ));
        }
        if finite.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(RegistryError::InvalidBuckets(
                "bounds must be strictly increasing",
            ));
        }
        Ok(finite.into())
    }

    pub(crate) fn with_bounds(bounds: Arc<[f64]>) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(Buckets {
            bounds,
            counts,
            sum: AtomicU64::new(0),
        }))
    }

    /// Records one observation. NaN is not a measurement and is ignored, so it
    /// cannot poison the sum.
    #[inline]
    pub fn observe(&self, value: f64) {
        if value.is_nan() {
            return;
        }
        let buckets = &*self.0;
        let index = buckets.bounds.partition_point(|&bound| bound < value);
        if let Some(count) = buckets.counts.get(index) {
            count.fetch_add(1, Relaxed);
        }
        // The closure always returns `Some`, so the update always succeeds.
        let _ = buckets.sum.fetch_update(Relaxed, Relaxed, |old| {
            Some((f64::from_bits(old) + value).to_bits())
        });
    }

    /// Records a duration in seconds.
    #[inline]
    pub fn observe_duration(&self, duration: Duration) {
        self.observe(duration.as_secs_f64());
    }

    /// The number of observations.
    pub fn count(&self) -> u64 {
        self.0.counts.iter().map(|count| count.load(Relaxed)).sum()
    }

    /// The sum of observations.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.0.sum.load(Relaxed))
    }

    /// The finite upper bounds (`+Inf` is implicit).
    pub fn bounds(&self) -> &[f64] {
        &self.0.bounds
    }

    /// Each bucket's upper bound (the last one `+Inf`) and its own,
    /// not cumulative, count.
    fn per_bucket(&self) -> Vec<(f64, u64)> {
        let bounds = self.0.bounds.iter().copied().chain([f64::INFINITY]);
        bounds
            .zip(self.0.counts.iter().map(|count| count.load(Relaxed)))
            .collect()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> fmt::Result {
        let buckets = self.per_bucket();
        let count = buckets.iter().map(|(_, count)| count).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl sealed::Sealed for Histogram {}
impl Metric for Histogram {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn own_counts(histogram: &Histogram) -> Vec<u64> {
        histogram.per_bucket().iter().map(|(_, n)| *n).collect()
    }

    #[test]
    fn counter_and_gauges() {
        let counter = Counter::new();
        counter.inc();
        counter.add(41);
        assert_eq!(counter.get(), 42);
        let shared = counter.clone();
        shared.inc();
        assert_eq!(counter.get(), 43);

        let gauge = Gauge::new();
        gauge.set(10);
        gauge.inc();
        gauge.dec();
        gauge.dec();
        gauge.add(-4);
        gauge.sub(10);
        assert_eq!(gauge.get(), -5);

        let ratio = GaugeF64::new();
        assert_eq!(ratio.get(), 0.0);
        ratio.set(0.5);
        ratio.add(0.25);
        ratio.sub(1.0);
        assert_eq!(ratio.get(), -0.25);
    }

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let histogram = Histogram::new(&[1.0, 2.0, 5.0]).unwrap();
        for value in [0.5, 1.0, 1.5, 2.0, 4.0, 7.0, f64::NAN] {
            histogram.observe(value);
        }
        // `le` is inclusive: 1.0 falls in the first bucket; NaN is ignored.
        assert_eq!(own_counts(&histogram), [2, 2, 1, 1]);
        assert_eq!(histogram.count(), 6);
        assert_eq!(histogram.sum(), 16.0);
    }

    #[test]
    fn histogram_duration_in_seconds() {
        let histogram = Histogram::new(Histogram::latency_buckets()).unwrap();
        histogram.observe_duration(Duration::from_micros(1500));
        assert_eq!(histogram.count(), 1);
        assert!((histogram.sum() - 0.0015).abs() < 1e-12);
    }

    #[test]
    fn bucket_bounds_are_checked() {
        assert!(Histogram::new(&[]).is_ok());
        let with_inf = Histogram::new(&[1.0, f64::INFINITY]).unwrap();
        assert_eq!(with_inf.bounds(), [1.0]);
        for bad in [
            &[2.0, 1.0][..],
            &[1.0, 1.0],
            &[f64::NAN],
            &[f64::NEG_INFINITY, 1.0],
            &[f64::INFINITY, 1.0],
        ] {
            assert!(
                matches!(Histogram::new(bad), Err(RegistryError::InvalidBuckets(_))),
                "{bad:?}"
            );
        }
        assert!(Histogram::new(&Histogram::exponential_buckets(1.0, 0.5, 3)).is_err());
    }

    #[test]
    fn bucket_helpers() {
        assert_eq!(
            Histogram::exponential_buckets(512.0, 2.0, 4),
            [512.0, 1024.0, 2048.0, 4096.0]
        );
        let latency = Histogram::latency_buckets();
        assert_eq!(latency.first(), Some(&1e-6));
        assert_eq!(latency.last(), Some(&10.0));
        assert!(Histogram::new(latency).is_ok());
    }

    #[test]
    fn concurrent_updates_are_exact() {
        const THREADS: u64 = 8;
        const PER_THREAD: u64 = 100_000;
        let counter = Counter::new();
        let histogram = Histogram::new(&[0.5, 1.5]).unwrap();
        thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for i in 0..PER_THREAD {
                        counter.inc();
                        // Alternate between the first two buckets; both are exact in binary.
                        histogram.observe(if i % 2 == 0 { 0.25 } else { 1.0 });
                    }
                });
            }
        });
        let total = THREADS * PER_THREAD;
        assert_eq!(counter.get(), total);
        assert_eq!(histogram.count(), total);
        assert_eq!(own_counts(&histogram), [total / 2, total / 2, 0]);
        // Every partial sum is a multiple of 0.25 far below 2^53, hence exact.
        assert_eq!(histogram.sum(), (total / 2) as f64 * 1.25);
    }
}
