//! A mergeable latency histogram in microseconds: a thin wrapper around an
//! auto-resizing [`hdrhistogram::Histogram`] keeping [`SIGFIG`] significant
//! digits, so every value below 2048 µs is exact and any other within 0.1 %.
//!
//! It serializes as `{"count", "min", "max", "hdr"}`, where `hdr` is the
//! histogram in HdrHistogram's compressed V2 format in base64 (as in
//! HdrHistogram's log files) and the other fields are for readers only.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

/// Significant decimal digits every histogram keeps.
pub const SIGFIG: u8 = 3;

/// A latency histogram in microseconds; see the [module docs](self).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(try_from = "Wire")]
pub struct LatencyHistogram(Histogram<u64>);

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self(Histogram::new(SIGFIG).expect("SIGFIG is between 0 and 5"))
    }

    /// Records one latency of `us` microseconds.
    pub fn record(&mut self, us: u64) {
        self.record_n(us, 1);
    }

    /// Records `n` latencies of `us` microseconds each; values beyond what
    /// the histogram can grow to (about 2⁶² µs) count as its highest value.
    pub fn record_n(&mut self, us: u64, n: u64) {
        if self.0.record_n(us, n).is_err() {
            self.0.saturating_record_n(us, n);
        }
    }

    /// Records one latency, rounded to the nearest microsecond.
    pub fn record_duration(&mut self, latency: Duration) {
        let us = latency.as_nanos().saturating_add(500) / 1000;
        self.record(u64::try_from(us).unwrap_or(u64::MAX));
    }

    /// Adds every sample of `other` to `self`.
    pub fn merge(&mut self, other: &Self) {
        self.0
            .add(&other.0)
            .expect("an auto-resizing histogram takes any other's values");
    }

    /// Number of recorded samples.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Whether nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The smallest recorded value (0 when empty).
    pub fn min(&self) -> u64 {
        self.0.min()
    }

    /// The largest recorded value (0 when empty).
    pub fn max(&self) -> u64 {
        self.0.max()
    }

    /// The `q`-quantile, `q` in `[0, 1]`: the value at or below which a
    /// fraction `q` of the samples lie (0 when empty).
    pub fn quantile(&self, q: f64) -> u64 {
        self.0.value_at_quantile(q)
    }

    /// The underlying HdrHistogram, for iterating over its buckets.
    pub fn hdr(&self) -> &Histogram<u64> {
        &self.0
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .field("min", &self.min())
            .field("max", &self.max())
            .finish_non_exhaustive()
    }
}

/// The serialized form of a [`LatencyHistogram`].
#[derive(Serialize, Deserialize)]
struct Wire {
    count: u64,
    min: u64,
    max: u64,
    /// Compressed V2 HdrHistogram, base64.
    hdr: String,
}

impl Serialize for LatencyHistogram {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(&self.0, &mut bytes)
            .map_err(serde::ser::Error::custom)?;
        Wire {
            count: self.count(),
            min: self.min(),
            max: self.max(),
            hdr: BASE64.encode(bytes),
        }
        .serialize(serializer)
    }
}

/// A serialized histogram that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistogramError {
    /// `hdr` is not base64.
    #[error("histogram `hdr` is not base64: {0}")]
    Base64(base64::DecodeError),
    /// `hdr` is not a V2 HdrHistogram.
    #[error("histogram `hdr` is not an HdrHistogram: {0}")]
    Hdr(hdrhistogram::serialization::DeserializeError),
}

impl TryFrom<Wire> for LatencyHistogram {
    type Error = HistogramError;

    fn try_from(wire: Wire) -> Result<Self, HistogramError> {
        let bytes = BASE64.decode(wire.hdr).map_err(HistogramError::Base64)?;
        let mut h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(HistogramError::Hdr)?;
        h.auto(true);
        Ok(Self(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_exact_below_2048_and_within_a_thousandth_above() {
        let mut h = LatencyHistogram::new();
        for v in 1..=1000 {
            h.record(v);
        }
        assert_eq!((h.quantile(0.5), h.quantile(0.999)), (500, 999));
        assert_eq!((h.min(), h.max(), h.count()), (1, 1000, 1000));
        h.record_n(1_500_000, 1000);
        let p75 = h.quantile(0.75) as f64;
        assert!((p75 - 1.5e6).abs() <= 1.5e3, "{p75}");
    }

    #[test]
    fn empty_and_extreme_values() {
        let h = LatencyHistogram::new();
        assert!(h.is_empty());
        assert_eq!((h.min(), h.max(), h.quantile(0.5)), (0, 0, 0));

        let mut h = LatencyHistogram::new();
        h.record_duration(Duration::from_nanos(1_499));
        h.record_duration(Duration::from_nanos(1_500));
        h.record_duration(Duration::MAX);
        assert_eq!((h.min(), h.quantile(0.5), h.count()), (1, 2, 3));
        assert!(h.max() > 1 << 60, "{h:?}");
    }

    #[test]
    fn serde_round_trip_and_merge_after_it() {
        let mut h = LatencyHistogram::new();
        for v in [0, 1, 5, 5, 130, 1_000, 99_999, 100_000_000] {
            h.record(v);
        }
        let json = serde_json::to_string(&h).unwrap();
        assert!(
            json.starts_with(r#"{"count":8,"min":0,"max":100007935,"hdr":""#),
            "{json}"
        );
        let mut back: LatencyHistogram = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);

        // A histogram read back still grows when merged with larger values.
        let mut big = LatencyHistogram::new();
        big.record(10_000_000_000);
        back.merge(&big);
        h.merge(&big);
        assert_eq!(back, h);
        assert_eq!(back.count(), 9);

        let bad = r#"{"count":1,"min":1,"max":1,"hdr":"not base64!"}"#;
        assert!(serde_json::from_str::<LatencyHistogram>(bad).is_err());
        let bad = r#"{"count":1,"min":1,"max":1,"hdr":"AAAA"}"#;
        assert!(serde_json::from_str::<LatencyHistogram>(bad).is_err());
    }
}
