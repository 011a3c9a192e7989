//! A topology document as a tree of values that remember where they were
//! written: a span of the file, or the environment variable that set them.

use std::ops::Range;

use toml_edit::{ImDocument, Item, TomlError};

/// Where a value was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum At {
    /// Bytes of the file.
    Span(Range<usize>),
    /// The override with this index.
    Env(usize),
}

/// A value and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) at: At,
}

/// A TOML value.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// A date or time, which no key of a topology takes.
    Datetime(String),
    Array(Vec<Node>),
    Table(Table),
}

/// A table's keys in the order written, each with where its key was written.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    pub(crate) entries: Vec<(String, At, Node)>,
}

impl Table {
    /// The value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        self.entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, n)| n)
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.entries
            .iter_mut()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, n)| n)
    }
}

impl Value {
    /// The value as it would be written in TOML, shortened.
    pub(crate) fn shown(&self) -> String {
        match self {
            Self::Str(s) => format!("{s:?}"),
            Self::Int(n) => n.to_string(),
            Self::Float(x) => x.to_string(),
            Self::Bool(b) => b.to_string(),
            Self::Datetime(d) => d.clone(),
            Self::Array(_) => "a list".to_owned(),
            Self::Table(_) => "a table".to_owned(),
        }
    }
}

/// Parses `text` into a tree; a syntax error gives its span and message.
pub(crate) fn parse(text: &str) -> Result<Node, (Range<usize>, String)> {
    let document = ImDocument::parse(text).map_err(|e: TomlError| {
        let span = e.span().unwrap_or(0..0);
        (span, e.message().to_owned())
    })?;
    let root = document.as_table();
    Ok(Node {
        value: Value::Table(table(root.iter().map(|(k, item)| {
            let key_at = root.key(k).and_then(|k| k.span());
            (k, key_at, item)
        }))),
        at: At::Span(0..0),
    })
}

fn table<'i>(entries: impl Iterator<Item = (&'i str, Option<Range<usize>>, &'i Item)>) -> Table {
    let mut out = Table::default();
    for (key, key_span, item) in entries {
        if let Some(node) = item_node(item, key_span.clone()) {
            let key_at = At::Span(key_span.unwrap_or_else(|| span_of(&node.at)));
            out.entries.push((key.to_owned(), key_at, node));
        }
    }
    out
}

fn span_of(at: &At) -> Range<usize> {
    match at {
        At::Span(span) => span.clone(),
        At::Env(_) => 0..0,
    }
}

/// The node of `item`; `fallback` locates items without a span of their
/// own (implicit tables).
fn item_node(item: &Item, fallback: Option<Range<usize>>) -> Option<Node> {
    let here = |span: Option<Range<usize>>| At::Span(span.or(fallback.clone()).unwrap_or(0..0));
    match item {
        Item::None => None,
        Item::Value(value) => Some(value_node(value, fallback.clone())),
        Item::Table(t) => Some(Node {
            value: Value::Table(table(t.iter().map(|(k, item)| {
                let key_at = t.key(k).and_then(|k| k.span());
                (k, key_at, item)
            }))),
            at: here(t.span()),
        }),
        Item::ArrayOfTables(tables) => Some(Node {
            value: Value::Array(
                tables
                    .iter()
                    .map(|t| Node {
                        value: Value::Table(table(t.iter().map(|(k, item)| {
                            let key_at = t.key(k).and_then(|k| k.span());
                            (k, key_at, item)
                        }))),
                        at: here(t.span()),
                    })
                    .collect(),
            ),
            at: here(tables.span()),
        }),
    }
}

fn value_node(value: &toml_edit::Value, fallback: Option<Range<usize>>) -> Node {
    use toml_edit::Value as V;
    let at = At::Span(value.span().or(fallback).unwrap_or(0..0));
    let value = match value {
        V::String(s) => Value::Str(s.value().clone()),
        V::Integer(n) => Value::Int(*n.value()),
        V::Float(x) => Value::Float(*x.value()),
        V::Boolean(b) => Value::Bool(*b.value()),
        V::Datetime(d) => Value::Datetime(d.value().to_string()),
        V::Array(a) => Value::Array(a.iter().map(|v| value_node(v, None)).collect()),
        V::InlineTable(t) => {
            let mut out = Table::default();
            for (key, value) in t.iter() {
                let node = value_node(value, None);
                let key_at = t
                    .key(key)
                    .and_then(|k| k.span())
                    .map_or_else(|| node.at.clone(), At::Span);
                out.entries.push((key.to_owned(), key_at, node));
            }
            Value::Table(out)
        }
    };
    Node { value, at }
}

/// Why an override could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OverrideError {
    /// The dotted key the variable names.
    pub(crate) key: String,
    /// What is in the way.
    pub(crate) message: String,
}

/// Sets the value of `path` (lower-case keys, outermost first) to `value`,
/// a variable's text read as an override reads it: a boolean, an integer,
/// a float, else a string. Missing tables are made.
pub(crate) fn apply_override(
    root: &mut Node,
    path: &[String],
    value: &str,
    index: usize,
) -> Result<(), OverrideError> {
    let key = path.join(".");
    let mut node = root;
    for (depth, part) in path.iter().enumerate() {
        let shown = node.value.shown();
        let Value::Table(table) = &mut node.value else {
            let within = path[..depth].join(".");
            return Err(OverrideError {
                key,
                message: format!(
                    "{within} is {shown}, not a table; overrides reach keys of tables such as \
                     [pool] (PMEMFABRIC_POOL__EXTENT_SIZE)"
                ),
            });
        };
        let last = depth + 1 == path.len();
        if last {
            let new = Node {
                value: read_env_value(value),
                at: At::Env(index),
            };
            match table.get_mut(part) {
                Some(existing) => *existing = new,
                None => table.entries.push((part.clone(), At::Env(index), new)),
            }
            return Ok(());
        }
        let position = match table.entries.iter().position(|(k, _, _)| k == part) {
            Some(position) => position,
            None => {
                let made = Node {
                    value: Value::Table(Table::default()),
                    at: At::Env(index),
                };
                table.entries.push((part.clone(), At::Env(index), made));
                table.entries.len() - 1
            }
        };
        node = &mut table.entries[position].2;
    }
    Err(OverrideError {
        key,
        message: "names no key".to_owned(),
    })
}

/// An override's text as a value: `true`/`false`, an integer, a float, or
/// the text itself.
fn read_env_value(text: &str) -> Value {
    if let Ok(b) = text.to_lowercase().parse::<bool>() {
        Value::Bool(b)
    } else if let Ok(n) = text.parse::<i64>() {
        Value::Int(n)
    } else if let Ok(x) = text.parse::<f64>() {
        Value::Float(x)
    } else {
        Value::Str(text.to_owned())
    }
}
