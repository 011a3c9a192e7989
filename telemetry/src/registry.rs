//! The registry: named metrics, families and scrape-time callbacks, kept in a
//! `prometheus-client` registry and rendered in the Prometheus text exposition
//! format, version 0.0.4.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    CounterValueEncoder, DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
    GaugeValueEncoder, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::error::RegistryError;
use crate::family::Family;
use crate::metric::{Counter, Gauge, GaugeF64, Histogram, Metric};
use crate::{read, write};

/// A metric computed when scraped: each call returns the samples as (label values,
/// in the order of the label names; value). Samples with the wrong number of label
/// values are dropped, and of samples with equal label values only the first is kept.
pub type SampleFn = Box<dyn Fn() -> Vec<(Vec<String>, f64)> + Send + Sync>;

/// The metrics of one process, rendered in registration order.
///
/// Registration takes a lock and validates names; it happens at start-up. The
/// returned `Arc`s are updated without any lock. Rendering reads each value
/// once and runs the [`SampleFn`]s.
#[derive(Default)]
pub struct Registry {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    /// One collector per registered name, in registration order.
    collectors: Vec<Arc<dyn Collector>>,
    /// Every registered name, in registration order.
    names: Vec<String>,
    /// Every series name in use: the registered names and a histogram's
    /// `_bucket`, `_sum` and `_count`.
    series: HashSet<String>,
}

/// One registered metric or family. Each is a `Collector` of its own, so its
/// HELP text is written as given (`Registry::register` would append a period).
#[derive(Debug)]
struct Described<T> {
    /// The name without a counter's `_total`, which the encoder appends.
    name: String,
    help: String,
    metric: Arc<T>,
}

impl<T: EncodeMetric + fmt::Debug + Send + Sync + 'static> Collector for Described<T> {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let kind = self.metric.metric_type();
        let metric_encoder = encoder.encode_descriptor(&self.name, &self.help, None, kind)?;
        self.metric.encode(metric_encoder)
    }
}

/// A registered collector, lent to the registry of one scrape.
#[derive(Debug)]
struct Shared(Arc<dyn Collector>);

impl Collector for Shared {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> fmt::Result {
        self.0.encode(encoder)
    }
}

/// A metric whose samples a [`SampleFn`] computes at every scrape.
struct Computed {
    /// The name without a counter's `_total`, which the encoder appends.
    name: String,
    help: String,
    kind: MetricType,
    label_names: Vec<String>,
    samples: SampleFn,
}

impl fmt::Debug for Computed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Computed")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("label_names", &self.label_names)
            .finish_non_exhaustive()
    }
}

impl Collector for Computed {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let mut samples = (self.samples)();
        samples.retain(|(values, _)| values.len() == self.label_names.len());
        // Stable: of equal label values, the first one returned stays first.
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        samples.dedup_by(|later, earlier| later.0 == earlier.0);
        let mut metric_encoder =
            encoder.encode_descriptor(&self.name, &self.help, None, self.kind)?;
        for (values, value) in &samples {
            let labels: Vec<(&str, &str)> = self
                .label_names
                .iter()
                .map(String::as_str)
                .zip(values.iter().map(String::as_str))
                .collect();
            let sample_encoder = metric_encoder.encode_family(&labels)?;
            if self.kind == MetricType::Counter {
                ConstCounter::new(Sample(*value)).encode(sample_encoder)?;
            } else {
                ConstGauge::new(Sample(*value)).encode(sample_encoder)?;
            }
        }
        Ok(())
    }
}

/// A computed value, written as an integer when it is one (`1024`, not
/// `1024.0`), as the integer metrics are.
#[derive(Debug, Clone, Copy)]
struct Sample(f64);

impl Sample {
    /// The largest magnitude below which every integer is an exact `f64`.
    const EXACT: f64 = 9_007_199_254_740_992.0;

    fn integer(self) -> Option<i64> {
        // In range and whole, so the cast is exact.
        (self.0.fract() == 0.0 && self.0.abs() <= Self::EXACT).then_some(self.0 as i64)
    }
}

impl EncodeGaugeValue for Sample {
    fn encode(&self, encoder: &mut GaugeValueEncoder<'_>) -> fmt::Result {
        match self.integer() {
            Some(integer) => EncodeGaugeValue::encode(&integer, encoder),
            None => EncodeGaugeValue::encode(&self.0, encoder),
        }
    }
}

impl EncodeCounterValue for Sample {
    fn encode(&self, encoder: &mut CounterValueEncoder<'_>) -> fmt::Result {
        match self
            .integer()
            .and_then(|integer| u64::try_from(integer).ok())
        {
            Some(integer) => EncodeCounterValue::encode(&integer, encoder),
            None => EncodeCounterValue::encode(&self.0, encoder),
        }
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a counter without labels; its name must end in `_total`.
    pub fn counter(&self, name: &str, help: &str) -> Result<Arc<Counter>, RegistryError> {
        self.add_metric(name, help, Counter::new())
    }

    /// Registers an integer gauge without labels.
    pub fn gauge(&self, name: &str, help: &str) -> Result<Arc<Gauge>, RegistryError> {
        self.add_metric(name, help, Gauge::new())
    }

    /// Registers a floating-point gauge without labels.
    pub fn gauge_f64(&self, name: &str, help: &str) -> Result<Arc<GaugeF64>, RegistryError> {
        self.add_metric(name, help, GaugeF64::new())
    }

    /// Registers a histogram without labels; see [`Histogram::new`] for `bounds`.
    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        bounds: &[f64],
    ) -> Result<Arc<Histogram>, RegistryError> {
        self.add_metric(name, help, Histogram::new(bounds)?)
    }

    /// Registers a family of counters with these label names; its name must
    /// end in `_total`.
    pub fn counter_family(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
    ) -> Result<Arc<Family<Counter>>, RegistryError> {
        self.add_family(name, help, label_names, Counter::new)
    }

    /// Registers a family of integer gauges with these label names.
    pub fn gauge_family(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
    ) -> Result<Arc<Family<Gauge>>, RegistryError> {
        self.add_family(name, help, label_names, Gauge::new)
    }

    /// Registers a family of floating-point gauges with these label names.
    pub fn gauge_f64_family(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
    ) -> Result<Arc<Family<GaugeF64>>, RegistryError> {
        self.add_family(name, help, label_names, GaugeF64::new)
    }

    /// Registers a family of histograms with these label names, every child with
    /// the same `bounds`. The label name `le` is reserved.
    pub fn histogram_family(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
        bounds: &[f64],
    ) -> Result<Arc<Family<Histogram>>, RegistryError> {
        let bounds = Histogram::checked_bounds(bounds)?;
        self.add_family(name, help, label_names, move || {
            Histogram::with_bounds(Arc::clone(&bounds))
        })
    }

    /// Registers a gauge computed by `samples` at every scrape: a region's size,
    /// or an info gauge such as `persistence_mode{mode="fsdax"} 1`. `samples`
    /// runs on the scraping thread, without any registry lock held.
    pub fn register_fn_gauge(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
        samples: SampleFn,
    ) -> Result<(), RegistryError> {
        self.add_computed(name, help, MetricType::Gauge, label_names, samples)
    }

    /// Registers a counter computed by `samples` at every scrape, e.g. one read
    /// from a structure that counts already. Its name must end in `_total`, and
    /// the values must never go down; `samples` runs as for
    /// [`Registry::register_fn_gauge`].
    pub fn register_fn_counter(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
        samples: SampleFn,
    ) -> Result<(), RegistryError> {
        self.add_computed(name, help, MetricType::Counter, label_names, samples)
    }

    /// Renders every metric in the text exposition format 0.0.4, in registration
    /// order, each as `# HELP`, `# TYPE` and its samples.
    pub fn render(&self) -> String {
        // A `prometheus-client` registry is filled through `&mut`, so each scrape
        // gets one of its own, sharing the collectors. No lock is held while
        // encoding: a `SampleFn` may even register metrics.
        let mut metrics = prometheus_client::registry::Registry::default();
        for collector in read(&self.inner).collectors.iter() {
            metrics.register_collector(Box::new(Shared(Arc::clone(collector))));
        }
        let mut text = String::new();
        if let Err(error) = prometheus_text::encode(&mut text, &metrics) {
            // Writing into a `String` does not fail, and neither do the collectors here.
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }

    fn add_metric<M: Metric>(
        &self,
        name: &str,
        help: &str,
        metric: M,
    ) -> Result<Arc<M>, RegistryError> {
        let metric = Arc::new(metric);
        self.insert(name, M::TYPE, &[], |name| Described {
            name,
            help: help.to_owned(),
            metric: Arc::clone(&metric),
        })?;
        Ok(metric)
    }

    fn add_family<M: Metric>(
        &self,
        name: &str,
        help: &str,
        label_names: &[&str],
        new_child: impl Fn() -> M + Send + Sync + 'static,
    ) -> Result<Arc<Family<M>>, RegistryError> {
        let family = Arc::new(Family::new(label_names, new_child));
        self.insert(name, M::TYPE, label_names, |name| Described {
            name,
            help: help.to_owned(),
            metric: Arc::clone(&family),
        })?;
        Ok(family)
    }

    fn add_computed(
        &self,
        name: &str,
        help: &str,
        kind: MetricType,
        label_names: &[&str],
        samples: SampleFn,
    ) -> Result<(), RegistryError> {
        self.insert(name, kind, label_names, |name| Computed {
            name,
            help: help.to_owned(),
            kind,
            label_names: label_names.iter().map(|name| (*name).to_owned()).collect(),
            samples,
        })
    }

    /// Checks the names, then registers the collector `collector` makes from
    /// the name `prometheus-client` is to be given.
    fn insert<C: Collector>(
        &self,
        name: &str,
        kind: MetricType,
        label_names: &[&str],
        collector: impl FnOnce(String) -> C,
    ) -> Result<(), RegistryError> {
        check_metric_name(name)?;
        let encoder_name = if kind == MetricType::Counter {
            name.strip_suffix("_total")
                .ok_or_else(|| RegistryError::CounterWithoutTotal(name.to_owned()))?
        } else {
            name
        };
        check_label_names(label_names, kind)?;
        let series = series_names(name, kind);
        let mut inner = write(&self.inner);
        if series.iter().any(|name| inner.series.contains(name)) {
            return Err(RegistryError::DuplicateMetric(name.to_owned()));
        }
        inner.series.extend(series);
        inner.names.push(name.to_owned());
        inner
            .collectors
            .push(Arc::new(collector(encoder_name.to_owned())));
        Ok(())
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("metrics", &read(&self.inner).names)
            .finish()
    }
}

/// The names a family's lines use: a histogram also writes `_bucket`, `_sum` and
/// `_count` series.
fn series_names(name: &str, kind: MetricType) -> Vec<String> {
    let mut names = vec![name.to_owned()];
    if kind == MetricType::Histogram {
        names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
    }
    names
}

fn check_metric_name(name: &str) -> Result<(), RegistryError> {
    let mut bytes = name.bytes();
    let valid = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
    if valid {
        Ok(())
    } else {
        Err(RegistryError::InvalidMetricName(name.to_owned()))
    }
}

fn check_label_names(label_names: &[&str], kind: MetricType) -> Result<(), RegistryError> {
    for (index, &name) in label_names.iter().enumerate() {
        let mut bytes = name.bytes();
        let valid = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.starts_with("__");
        if !valid {
            return Err(RegistryError::InvalidLabelName(name.to_owned()));
        }
        if kind == MetricType::Histogram && name == "le" {
            return Err(RegistryError::ReservedLabelName(name.to_owned()));
        }
        if label_names[..index].contains(&name) {
            return Err(RegistryError::DuplicateLabelName(name.to_owned()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `text`, sorted: a family's children come in no particular order.
    fn sorted_lines(text: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn counter_text() {
        let registry = Registry::new();
        let served = registry
            .counter("pmem_requests_total", "Requests served.")
            .unwrap();
        served.add(7);
        assert_eq!(
            registry.render(),
            "# HELP pmem_requests_total Requests served.\n\
             # TYPE pmem_requests_total counter\n\
             pmem_requests_total 7\n"
        );
    }

    #[test]
    fn labelled_family_text() {
        let registry = Registry::new();
        let ops = registry
            .counter_family("pmem_ops_total", "Operations.", &["op", "status"])
            .unwrap();
        // No children yet: only the header.
        assert_eq!(
            registry.render(),
            "# HELP pmem_ops_total Operations.\n# TYPE pmem_ops_total counter\n"
        );
        ops.with(&["WRITE", "OK"]).inc();
        ops.with(&["READ", "ERR"]).add(2);
        ops.with(&["READ", "OK"]).add(3);
        let text = registry.render();
        assert!(text.starts_with("# HELP pmem_ops_total Operations.\n# TYPE"));
        assert_eq!(
            sorted_lines(&text),
            sorted_lines(
                "# HELP pmem_ops_total Operations.\n\
             # TYPE pmem_ops_total counter\n\
             pmem_ops_total{op=\"READ\",status=\"ERR\"} 2\n\
             pmem_ops_total{op=\"READ\",status=\"OK\"} 3\n\
             pmem_ops_total{op=\"WRITE\",status=\"OK\"} 1\n"
            )
        );
    }

    #[test]
    fn gauges_text() {
        let registry = Registry::new();
        registry.gauge("in_flight", "In flight.").unwrap().set(-3);
        registry.gauge_f64("ratio", "A ratio.").unwrap().set(0.125);
        let links = registry
            .gauge_family("link_up", "Links up.", &["link"])
            .unwrap();
        links.with(&["b"]).set(0);
        links.with(&["a"]).set(1);
        let temps = registry
            .gauge_f64_family("temp_celsius", "Temperature.", &["socket"])
            .unwrap();
        temps.with(&["0"]).set(f64::NAN);
        let text = registry.render();
        assert!(text.starts_with("# HELP in_flight In flight.\n# TYPE in_flight gauge\n"));
        assert_eq!(
            sorted_lines(&text),
            sorted_lines(
                "# HELP in_flight In flight.\n# TYPE in_flight gauge\nin_flight -3\n\
             # HELP ratio A ratio.\n# TYPE ratio gauge\nratio 0.125\n\
             # HELP link_up Links up.\n# TYPE link_up gauge\n\
             link_up{link=\"a\"} 1\nlink_up{link=\"b\"} 0\n\
             # HELP temp_celsius Temperature.\n# TYPE temp_celsius gauge\n\
             temp_celsius{socket=\"0\"} NaN\n"
            )
        );
    }

    #[test]
    fn histogram_text() {
        let registry = Registry::new();
        let latency = registry
            .histogram("op_seconds", "Latency.", &[0.001, 0.01, 1.0])
            .unwrap();
        for value in [0.0005, 0.001, 0.005, 2.0] {
            latency.observe(value);
        }
        assert_eq!(
            registry.render(),
            "# HELP op_seconds Latency.\n\
             # TYPE op_seconds histogram\n\
             op_seconds_bucket{le=\"0.001\"} 2\n\
             op_seconds_bucket{le=\"0.01\"} 3\n\
             op_seconds_bucket{le=\"1\"} 3\n\
             op_seconds_bucket{le=\"+Inf\"} 4\n\
             op_seconds_sum 2.0065\n\
             op_seconds_count 4\n"
        );
    }

    #[test]
    fn histogram_family_text() {
        let registry = Registry::new();
        let sizes = registry
            .histogram_family("op_bytes", "Sizes.", &["op"], &[64.0])
            .unwrap();
        sizes.with(&["WRITE"]).observe(128.0);
        sizes.with(&["READ"]).observe(8.0);
        assert_eq!(
            sorted_lines(&registry.render()),
            sorted_lines(
                "# HELP op_bytes Sizes.\n\
             # TYPE op_bytes histogram\n\
             op_bytes_bucket{op=\"READ\",le=\"64\"} 1\n\
             op_bytes_bucket{op=\"READ\",le=\"+Inf\"} 1\n\
             op_bytes_sum{op=\"READ\"} 8.0\n\
             op_bytes_count{op=\"READ\"} 1\n\
             op_bytes_bucket{op=\"WRITE\",le=\"64\"} 0\n\
             op_bytes_bucket{op=\"WRITE\",le=\"+Inf\"} 1\n\
             op_bytes_sum{op=\"WRITE\"} 128.0\n\
             op_bytes_count{op=\"WRITE\"} 1\n"
            )
        );
    }

    #[test]
    fn escaping_text() {
        let registry = Registry::new();
        let files = registry
            .counter_family(
                "files_total",
                "Paths like C:\\tmp\nand \"quotes\".",
                &["path"],
            )
            .unwrap();
        files.with(&["a\\b\n\"c\""]).inc();
        assert_eq!(
            registry.render(),
            "# HELP files_total Paths like C:\\\\tmp\\nand \"quotes\".\n\
             # TYPE files_total counter\n\
             files_total{path=\"a\\\\b\\n\\\"c\\\"\"} 1\n"
        );
    }

    #[test]
    fn callbacks_text() {
        let registry = Registry::new();
        registry
            .register_fn_gauge(
                "region_bytes",
                "Region size.",
                &["region"],
                Box::new(|| {
                    vec![
                        (vec!["r2".into()], 2048.0),
                        (vec!["r1".into()], 1024.0),
                        (vec!["r1".into()], 1.0),
                        (vec![], 5.0),
                        (vec!["x".into(), "y".into()], 6.0),
                    ]
                }),
            )
            .unwrap();
        registry
            .register_fn_counter(
                "flushes_total",
                "Flushes.",
                &[],
                Box::new(|| vec![(vec![], 12.0)]),
            )
            .unwrap();
        assert_eq!(
            registry.render(),
            "# HELP region_bytes Region size.\n# TYPE region_bytes gauge\n\
             region_bytes{region=\"r1\"} 1024\nregion_bytes{region=\"r2\"} 2048\n\
             # HELP flushes_total Flushes.\n# TYPE flushes_total counter\nflushes_total 12\n"
        );
    }

    #[test]
    fn callbacks_may_register() {
        let registry = Arc::new(Registry::new());
        let inner = Arc::downgrade(&registry);
        registry
            .register_fn_gauge(
                "registers_more",
                "A callback that registers.",
                &[],
                Box::new(move || {
                    if let Some(registry) = inner.upgrade() {
                        let _ = registry.counter("late_total", "Late.");
                    }
                    vec![(vec![], 1.0)]
                }),
            )
            .unwrap();
        registry.render();
        assert!(registry.render().contains("late_total 0\n"));
    }

    #[test]
    fn names_are_validated() {
        let registry = Registry::new();
        for good in ["a", "_a", ":a", "a:b_c9", "Z"] {
            assert!(registry.gauge(good, "ok").is_ok(), "{good}");
        }
        for bad in ["", "9a", "a-b", "a b", "é", "a.b"] {
            assert_eq!(
                registry.gauge(bad, "bad").unwrap_err(),
                RegistryError::InvalidMetricName(bad.to_owned())
            );
        }
        for bad in ["", "9a", "a:b", "__x", "a-b", "ü"] {
            assert_eq!(
                registry.gauge_family("g", "bad", &[bad]).unwrap_err(),
                RegistryError::InvalidLabelName(bad.to_owned())
            );
        }
        assert!(registry.gauge_family("g_le", "ok", &["_x", "le"]).is_ok());
        assert_eq!(
            registry
                .histogram_family("h", "bad", &["le"], &[1.0])
                .unwrap_err(),
            RegistryError::ReservedLabelName("le".into())
        );
        assert_eq!(
            registry
                .counter_family("c_total", "bad", &["op", "op"])
                .unwrap_err(),
            RegistryError::DuplicateLabelName("op".into())
        );
        for counter in ["c", "c_totals", "total"] {
            assert_eq!(
                registry.counter(counter, "bad").unwrap_err(),
                RegistryError::CounterWithoutTotal(counter.to_owned())
            );
        }
        assert!(matches!(
            registry.histogram("h", "bad", &[2.0, 1.0]),
            Err(RegistryError::InvalidBuckets(_))
        ));
    }

    #[test]
    fn duplicates_are_refused() {
        let registry = Registry::new();
        registry.counter("ops_total", "Ops.").unwrap();
        registry.histogram("lat", "Latency.", &[1.0]).unwrap();
        let duplicate = |name: &str| RegistryError::DuplicateMetric(name.to_owned());
        assert_eq!(
            registry.gauge("ops_total", "Again.").unwrap_err(),
            duplicate("ops_total")
        );
        assert_eq!(
            registry
                .counter_family("ops_total", "Again.", &["op"])
                .unwrap_err(),
            duplicate("ops_total")
        );
        assert_eq!(
            registry
                .register_fn_gauge("ops_total", "Again.", &[], Box::new(Vec::new))
                .unwrap_err(),
            duplicate("ops_total")
        );
        assert_eq!(
            registry.gauge("lat_count", "Clash.").unwrap_err(),
            duplicate("lat_count")
        );
        assert_eq!(
            registry.gauge("lat", "Clash.").unwrap_err(),
            duplicate("lat")
        );
        registry
            .gauge("req_sum", "A histogram called req clashes.")
            .unwrap();
        assert_eq!(
            registry.histogram("req", "Clash.", &[]).unwrap_err(),
            duplicate("req")
        );
        // A refused registration leaves nothing behind.
        assert_eq!(registry.render().matches("# TYPE").count(), 3);
    }
}
