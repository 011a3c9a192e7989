//! Why the registry refused a metric: the one error type the registry,
//! the metrics and the families share.

/// Why a metric could not be registered, or a family child looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The metric name does not match `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    #[error("invalid metric name {0:?}: expected [a-zA-Z_:][a-zA-Z0-9_:]*")]
    InvalidMetricName(String),
    /// A counter's name does not end in `_total`.
    #[error("counter name {0:?} does not end in \"_total\"")]
    CounterWithoutTotal(String),
    /// The label name does not match `[a-zA-Z_][a-zA-Z0-9_]*`, or starts with `__`.
    #[error("invalid label name {0:?}: expected [a-zA-Z_][a-zA-Z0-9_]*, not starting with \"__\"")]
    InvalidLabelName(String),
    /// The label name is one the metric type writes itself (`le` of histograms).
    #[error("label name {0:?} is reserved for histogram buckets")]
    ReservedLabelName(String),
    /// The same label name appears twice in one family.
    #[error("label name {0:?} is given twice")]
    DuplicateLabelName(String),
    /// A metric of this name is registered already, or the name clashes with the
    /// `_bucket`, `_sum` or `_count` series of a histogram.
    #[error("metric {0:?} is registered already or clashes with a histogram's series")]
    DuplicateMetric(String),
    /// Histogram bounds that are not finite and strictly increasing.
    #[error("invalid histogram buckets: {0}")]
    InvalidBuckets(&'static str),
    /// A family child was asked for with the wrong number of label values.
    #[error("expected {expected} label values, got {got}")]
    LabelCount {
        /// The number of label names of the family.
        expected: usize,
        /// The number of values given.
        got: usize,
    },
}
