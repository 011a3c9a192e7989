//! Labelled families: one metric value per combination of label values.

use std::fmt;
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family;
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::error::RegistryError;
use crate::metric::{Counter, Metric};

/// Label (name, value) pairs, in the order of the family's label names.
type LabelSet = Vec<(String, String)>;

/// Makes a family's child at zero.
type NewChild<M> = Box<dyn Fn() -> M + Send + Sync>;

/// Metrics of one name with fixed label names, e.g. `["op", "status"]`, and one
/// child per combination of label values, created on first use: a
/// `prometheus-client` family.
///
/// Looking a child up takes a lock (a read lock once it exists); hot paths look
/// it up once and keep the `Arc`. A family without children renders only its
/// `# HELP` and `# TYPE` lines. Children are rendered in no particular order.
pub struct Family<M> {
    label_names: Box<[String]>,
    children: family::Family<LabelSet, M, NewChild<M>>,
}

impl<M: Metric> Family<M> {
    pub(crate) fn new(
        label_names: &[&str],
        new_child: impl Fn() -> M + Send + Sync + 'static,
    ) -> Self {
        Self {
            label_names: label_names.iter().map(|name| (*name).to_owned()).collect(),
            children: family::Family::new_with_constructor(Box::new(new_child)),
        }
    }

    /// The label names, in the order values are given.
    pub fn label_names(&self) -> &[String] {
        &self.label_names
    }

    /// The child for these label values, in the order of the label names,
    /// created at zero if it does not exist yet.
    ///
    /// # Panics
    ///
    /// If the number of values differs from the number of label names: that is a
    /// bug in the caller, which names its labels in code. [`Family::try_with`]
    /// returns it as an error instead.
    pub fn with(&self, label_values: &[&str]) -> Arc<M> {
        self.try_with(label_values)
            .unwrap_or_else(|error| panic!("metric family {:?}: {error}", self.label_names))
    }

    /// Like [`Family::with`], but a wrong number of values is an error.
    pub fn try_with(&self, label_values: &[&str]) -> Result<Arc<M>, RegistryError> {
        if label_values.len() != self.label_names.len() {
            return Err(RegistryError::LabelCount {
                expected: self.label_names.len(),
                got: label_values.len(),
            });
        }
        let labels: LabelSet = self
            .label_names
            .iter()
            .zip(label_values)
            .map(|(name, value)| (name.clone(), (*value).to_owned()))
            .collect();
        Ok(Arc::new(self.children.get_or_create_owned(&labels)))
    }
}

impl<M: Metric> TypedMetric for Family<M> {
    const TYPE: MetricType = M::TYPE;
}

impl<M: Metric> EncodeMetric for Family<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> fmt::Result {
        self.children.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

impl<M: fmt::Debug> fmt::Debug for Family<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family")
            .field("label_names", &self.label_names)
            .field("children", &self.children)
            .finish()
    }
}

/// The children of a two-label counter family, cached by small row and
/// column indices (say, operation and status code), so a hot path finds its
/// counter with one atomic load instead of a lock. Indices outside the table
/// fall back to [`Family::with`].
pub struct CounterTable<const ROWS: usize, const COLS: usize> {
    family: Arc<Family<Counter>>,
    cells: [[OnceLock<Arc<Counter>>; COLS]; ROWS],
}

impl<const ROWS: usize, const COLS: usize> CounterTable<ROWS, COLS> {
    /// A table over `family`, which must have two label names.
    pub fn new(family: Arc<Family<Counter>>) -> Self {
        Self {
            family,
            cells: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// Increments the counter at (`row`, `col`); `labels` gives its two label
    /// values the first time it is used.
    pub fn inc(&self, row: usize, col: usize, labels: impl FnOnce() -> [String; 2]) {
        let lookup = |labels: [String; 2]| self.family.with(&[&labels[0], &labels[1]]);
        match self.cells.get(row).and_then(|r| r.get(col)) {
            Some(cell) => cell.get_or_init(|| lookup(labels())).inc(),
            None => lookup(labels()).inc(),
        }
    }
}

impl<const ROWS: usize, const COLS: usize> fmt::Debug for CounterTable<ROWS, COLS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterTable")
            .field("label_names", &self.family.label_names())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Counter;

    #[test]
    fn children_are_shared() {
        let family = Family::new(&["op", "status"], Counter::new);
        family.with(&["WRITE", "OK"]).inc();
        let read_ok = family.with(&["READ", "OK"]);
        read_ok.add(2);
        family.with(&["READ", "OK"]).inc();
        assert_eq!(read_ok.get(), 3);
        assert_eq!(family.with(&["WRITE", "OK"]).get(), 1);
    }

    #[test]
    fn wrong_number_of_values() {
        let family = Family::new(&["op"], Counter::new);
        assert_eq!(
            family.try_with(&["READ", "OK"]).unwrap_err(),
            RegistryError::LabelCount {
                expected: 1,
                got: 2
            }
        );
        assert!(family.try_with(&[]).is_err());
    }

    #[test]
    #[should_panic(expected = "expected 2 label values, got 1")]
    fn with_panics_on_wrong_number_of_values() {
        Family::new(&["op", "status"], Counter::new).with(&["READ"]);
    }

    #[test]
    fn counter_table_caches_children_and_falls_back_outside() {
        let registry = crate::Registry::new();
        let family = registry
            .counter_family("ops_total", "Operations.", &["op", "status"])
            .unwrap();
        let table: CounterTable<2, 2> = CounterTable::new(family);
        let labels = |op: &str, status: &str| [op.to_owned(), status.to_owned()];
        table.inc(0, 1, || labels("READ", "DENIED"));
        table.inc(0, 1, || panic!("cached: labels are not asked for again"));
        table.inc(7, 9, || labels("ODD", "RARE"));
        table.inc(7, 9, || labels("ODD", "RARE"));
        let text = registry.render();
        assert!(
            text.contains("ops_total{op=\"READ\",status=\"DENIED\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ops_total{op=\"ODD\",status=\"RARE\"} 2"),
            "{text}"
        );
    }
}
