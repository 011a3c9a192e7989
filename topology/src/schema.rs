//! The shape of a topology file, checked before its values are read.
//!
//! Every unknown or missing key, value of the wrong type, unknown choice and
//! unreadable size is reported at once, each with where it was written (file,
//! line and column, or the environment variable that set it) and the item it
//! belongs to, named by id (`server "A" NIC "n0": listen is missing`).
//! Overrides from `PMEMFABRIC_*` variables are applied here too, so that a
//! value they set is blamed on them.

use std::fmt;
use std::ops::Range;

use crate::size::{ByteSize, parse_u64};
use crate::tree::{At, Node, Table, Value};

/// Where a value of the topology was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A place in the topology file (line and column count from 1).
    File {
        /// The file (or embedded source name).
        file: String,
        /// The line.
        line: usize,
        /// The column, in characters.
        column: usize,
    },
    /// An environment variable that overrides the file.
    Env {
        /// The variable's name.
        var: String,
        /// Its value.
        value: String,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { file, line, column } => write!(f, "{file}:{line}:{column}"),
            Self::Env { var, value } => write!(f, "environment variable {var}={value}"),
        }
    }
}

/// One problem with the shape of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaProblem {
    /// Where the offending value (or its table) was written.
    pub origin: Origin,
    /// The item it belongs to, e.g. `server "A" NIC "n0"`.
    pub item: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.origin, self.item, self.message)
    }
}

/// What a key's value must be.
#[derive(Clone, Copy)]
enum Kind {
    /// A string (an id, an address, a path); numbers are taken as text.
    Text,
    /// A size: an integer of bytes or a string such as `"64MiB"`.
    Size,
    /// A 64-bit number: an integer or a string such as `"0x1_0000_0000"`.
    Number,
    /// A non-negative integer (a count).
    Count,
    /// One of a fixed set of strings.
    Choice(&'static [&'static str]),
    /// A table of the given shape.
    Table(&'static Shape),
    /// A list of tables of the given shape (`[[key]]` or `[{…}, …]`).
    List(&'static Shape),
    /// A non-negative integer, or a list of strings.
    CountOrTexts,
}

/// A key a table may have.
struct Field {
    name: &'static str,
    kind: Kind,
    required: bool,
    /// What a right value looks like, for messages.
    expect: &'static str,
}

const fn field(name: &'static str, kind: Kind, expect: &'static str) -> Field {
    Field {
        name,
        kind,
        required: false,
        expect,
    }
}

const fn required(name: &'static str, kind: Kind, expect: &'static str) -> Field {
    Field {
        name,
        kind,
        required: true,
        expect,
    }
}

/// How the tables of a shape are named in messages.
#[derive(Clone, Copy)]
enum Naming {
    /// Always this name (`pool`).
    Fixed(&'static str),
    /// A list element named by its id, alone (`server "A"`).
    Id(&'static str),
    /// A list element named by its id after its parent
    /// (`server "A" NIC "n0"`).
    NestedId(&'static str),
    /// A list element numbered from 1 after its parent (`link #2`).
    NestedIndex(&'static str),
    /// A table after its parent (`port "p0" roce`).
    Nested(&'static str),
}

/// The keys of one kind of table.
struct Shape {
    naming: Naming,
    fields: &'static [Field],
}

const ID: &str = "a name such as \"A\"";
const LISTEN: &str = "an IP address and port such as \"127.0.0.1:7000\"";
const SIZE: &str = "a size such as 65536 or \"64MiB\"";
const NUMBER: &str = "an integer or a string such as \"0x1_0000_0000\"";
const COUNT: &str = "a non-negative integer";
const PATH: &str = "a path";

static ALLOCATOR: Shape = Shape {
    naming: Naming::Fixed("pool.allocator"),
    fields: &[
        field("metadata_region", Kind::Text, "a region id"),
        field("page_table_entries", Kind::Count, COUNT),
        field("names", Kind::Count, COUNT),
    ],
};

static POOL: Shape = Shape {
    naming: Naming::Fixed("pool"),
    fields: &[
        field("name", Kind::Text, "a name"),
        field("extent_size", Kind::Size, SIZE),
        field("base_address", Kind::Number, NUMBER),
        field("region_alignment", Kind::Size, SIZE),
        field("allocator", Kind::Table(&ALLOCATOR), "a table"),
        field(
            "replicas",
            Kind::Count,
            "1, 2 or 3 (copies of every region)",
        ),
    ],
};

static REGION: Shape = Shape {
    naming: Naming::Id("region"),
    fields: &[
        required("id", Kind::Text, "a region id such as \"PA.1\""),
        required("size", Kind::Size, SIZE),
        field("address", Kind::Number, NUMBER),
        field(
            "cache",
            Kind::Choice(&["write-back", "non-temporal"]),
            "a cache policy",
        ),
        field(
            "replicas",
            Kind::CountOrTexts,
            "1, 2 or 3 copies, or the backups' places such as [\"B:0\"] (SERVER:SOCKET[:DEVICE])",
        ),
    ],
};

static DEVICE: Shape = Shape {
    naming: Naming::NestedId("PMEM device"),
    fields: &[
        required("id", Kind::Text, ID),
        field("path", Kind::Text, PATH),
        field("regions", Kind::List(&REGION), "a list of regions"),
    ],
};

static SOCKET: Shape = Shape {
    naming: Naming::NestedId("socket"),
    fields: &[
        required("id", Kind::Text, ID),
        field("devices", Kind::List(&DEVICE), "a list of PMEM devices"),
    ],
};

static SERVER_NIC: Shape = Shape {
    naming: Naming::NestedId("NIC"),
    fields: &[
        required("id", Kind::Text, ID),
        required(
            "socket",
            Kind::Text,
            "the id of one of the server's sockets",
        ),
        required("listen", Kind::Text, LISTEN),
        field("transport", Kind::Choice(&["tcp", "verbs"]), "a transport"),
        field("rdma_device", Kind::Text, "an RDMA device such as \"rxe0\""),
    ],
};

static SERVER: Shape = Shape {
    naming: Naming::Id("server"),
    fields: &[
        required("id", Kind::Text, ID),
        field("admin", Kind::Text, LISTEN),
        field("data_dir", Kind::Text, PATH),
        field("domain", Kind::Text, "a failure domain such as \"rack-a\""),
        field(
            "persistence",
            Kind::Choice(&["auto", "dax", "msync", "libpmem", "emulated"]),
            "a persistence mechanism",
        ),
        field("sockets", Kind::List(&SOCKET), "a list of sockets"),
        field("nics", Kind::List(&SERVER_NIC), "a list of NICs"),
    ],
};

static ROCE: Shape = Shape {
    naming: Naming::Nested("roce"),
    fields: &[
        required("interface", Kind::Text, "a network interface"),
        required("ip", Kind::Text, "an IPv4 address"),
        field("mtu", Kind::Count, "256, 512, 1024, 2048 or 4096"),
    ],
};

static PORT: Shape = Shape {
    naming: Naming::NestedId("port"),
    fields: &[
        required("id", Kind::Text, ID),
        required("listen", Kind::Text, LISTEN),
        field("roce", Kind::Table(&ROCE), "a table"),
    ],
};

static LINK: Shape = Shape {
    naming: Naming::NestedIndex("link"),
    fields: &[
        required("server", Kind::Text, "a server id"),
        required("nic", Kind::Text, "the id of one of the server's NICs"),
    ],
};

static FABRIC_DEVICE: Shape = Shape {
    naming: Naming::Id("fabric device"),
    fields: &[
        required("id", Kind::Text, ID),
        field("admin", Kind::Text, LISTEN),
        field("ports", Kind::List(&PORT), "a list of ports"),
        field("links", Kind::List(&LINK), "a list of links"),
    ],
};

static RNIC: Shape = Shape {
    naming: Naming::NestedId("RNIC"),
    fields: &[
        required("id", Kind::Text, ID),
        required("fabric_device", Kind::Text, "a fabric device id"),
        field("port", Kind::Text, "a port id of the fabric device"),
        field("local_addr", Kind::Text, "an IP address"),
        field("transport", Kind::Choice(&["tcp", "roce"]), "a transport"),
        field(
            "rdma_device",
            Kind::Text,
            "an RDMA device such as \"mlx5_0\"",
        ),
    ],
};

static ALLOW: Shape = Shape {
    naming: Naming::NestedIndex("allow"),
    fields: &[
        required("region", Kind::Text, "a region id"),
        field("offset", Kind::Size, SIZE),
        field("size", Kind::Size, SIZE),
        field("access", Kind::Choice(&["read-write", "read"]), "an access"),
    ],
};

static CLIENT: Shape = Shape {
    naming: Naming::Id("client"),
    fields: &[
        required("id", Kind::Text, ID),
        field("rnics", Kind::List(&RNIC), "a list of RNICs"),
        field("allow", Kind::List(&ALLOW), "a list of ranges"),
    ],
};

static TOPOLOGY: Shape = Shape {
    naming: Naming::Fixed("topology"),
    fields: &[
        field("pool", Kind::Table(&POOL), "a table ([pool])"),
        field(
            "servers",
            Kind::List(&SERVER),
            "a list of tables ([[servers]])",
        ),
        field(
            "fabric_devices",
            Kind::List(&FABRIC_DEVICE),
            "a list of tables ([[fabric_devices]])",
        ),
        field(
            "clients",
            Kind::List(&CLIENT),
            "a list of tables ([[clients]])",
        ),
    ],
};

/// Walks a parsed topology against its shape, collecting problems.
pub(crate) struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    vars: &'a [(String, String)],
    problems: Vec<SchemaProblem>,
}

impl<'a> Checker<'a> {
    /// A checker for `text`, read from `file`, with the overrides `vars`
    /// (name, value) that [`At::Env`] indexes.
    pub(crate) fn new(file: &'a str, text: &'a str, vars: &'a [(String, String)]) -> Self {
        Self {
            file,
            text,
            vars,
            problems: Vec::new(),
        }
    }

    /// Where `at` is, for a message.
    pub(crate) fn origin(&self, at: &At) -> Origin {
        match at {
            At::Span(span) => {
                let (line, column) = line_column(self.text, span);
                Origin::File {
                    file: self.file.to_owned(),
                    line,
                    column,
                }
            }
            At::Env(index) => {
                let (var, value) = &self.vars[*index];
                Origin::Env {
                    var: var.clone(),
                    value: value.clone(),
                }
            }
        }
    }

    /// Records a problem.
    pub(crate) fn report(&mut self, at: &At, item: &str, message: String) {
        let origin = self.origin(at);
        self.problems.push(SchemaProblem {
            origin,
            item: item.to_owned(),
            message,
        });
    }

    /// Checks the whole document and returns every problem found, the
    /// ones recorded before included.
    pub(crate) fn check(mut self, root: &Node) -> Vec<SchemaProblem> {
        match &root.value {
            Value::Table(table) => self.table(&TOPOLOGY, table, &root.at, "topology"),
            _ => self.report(&root.at, "topology", "is not a table".to_owned()),
        }
        self.problems
    }

    fn table(&mut self, shape: &Shape, table: &Table, at: &At, item: &str) {
        for (key, key_at, node) in &table.entries {
            match shape.fields.iter().find(|f| f.name == key.as_str()) {
                Some(field) => self.value(field, node, item),
                None => {
                    let message = unknown_key(key, shape);
                    self.report(key_at, item, message);
                }
            }
        }
        for field in shape.fields.iter().filter(|f| f.required) {
            if table.get(field.name).is_none() {
                let message = format!("{} is missing ({})", field.name, field.expect);
                self.report(at, item, message);
            }
        }
    }

    fn value(&mut self, field: &Field, node: &Node, item: &str) {
        let name = field.name;
        let wrong =
            |node: &Node| format!("{name} = {}: expected {}", node.value.shown(), field.expect);
        match (field.kind, &node.value) {
            (Kind::Text, Value::Str(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_)) => {}
            (Kind::Size, Value::Int(n)) if *n < 0 => {
                let message = format!("{name} = {n} is negative: a size counts bytes up from 0");
                self.report(&node.at, item, message);
            }
            (Kind::Size, Value::Str(text)) => {
                if let Err(e) = text.parse::<ByteSize>() {
                    self.report(&node.at, item, format!("{name}: {e}"));
                }
            }
            (Kind::Number | Kind::Count, Value::Int(n)) if *n < 0 => {
                let message = format!("{name} = {n} is negative: expected {}", field.expect);
                self.report(&node.at, item, message);
            }
            (Kind::Number | Kind::Count, Value::Str(text)) => {
                if let Err(e) = parse_u64(text) {
                    self.report(&node.at, item, format!("{name}: {e}"));
                }
            }
            (Kind::Size | Kind::Number | Kind::Count, Value::Int(_)) => {}
            (Kind::CountOrTexts, Value::Int(n)) if *n < 0 => {
                let message = format!("{name} = {n} is negative: expected {}", field.expect);
                self.report(&node.at, item, message);
            }
            (Kind::CountOrTexts, Value::Int(_)) => {}
            (Kind::CountOrTexts, Value::Array(elements)) => {
                for (index, element) in elements.iter().enumerate() {
                    if !matches!(element.value, Value::Str(_)) {
                        let message = format!(
                            "{name} #{}: {} is not a string: expected {}",
                            index + 1,
                            element.value.shown(),
                            field.expect
                        );
                        self.report(&element.at, item, message);
                    }
                }
            }
            (Kind::Choice(choices), Value::Str(text)) => {
                if !choices.contains(&text.as_str()) {
                    let listed: Vec<String> = choices.iter().map(|c| format!("{c:?}")).collect();
                    let message = format!("{name} {text:?}: expected one of {}", listed.join(", "));
                    self.report(&node.at, item, message);
                }
            }
            (Kind::Table(shape), Value::Table(table)) => {
                let item = name_of(shape, item, table, 0);
                self.table(shape, table, &node.at, &item);
            }
            (Kind::List(shape), Value::Array(elements)) => {
                for (index, element) in elements.iter().enumerate() {
                    match &element.value {
                        Value::Table(table) => {
                            let item = name_of(shape, item, table, index);
                            self.table(shape, table, &element.at, &item);
                        }
                        _ => {
                            let message = format!(
                                "{name} #{}: {} is not a table: expected {}",
                                index + 1,
                                element.value.shown(),
                                field.expect
                            );
                            self.report(&element.at, item, message);
                        }
                    }
                }
            }
            _ => {
                let message = wrong(node);
                self.report(&node.at, item, message);
            }
        }
    }
}

/// The message for a key `shape` does not have, with the nearest known key.
fn unknown_key(key: &str, shape: &Shape) -> String {
    let known: Vec<&str> = shape.fields.iter().map(|f| f.name).collect();
    let nearest = known
        .iter()
        .map(|k| (distance(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min();
    match nearest {
        Some((_, k)) => format!("unknown key {key:?}; did you mean {k:?}?"),
        None => format!("unknown key {key:?} (known here: {})", known.join(", ")),
    }
}

/// The edit distance between two short strings.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The name of a table of `shape` inside `parent`, `index`th in its list.
fn name_of(shape: &Shape, parent: &str, table: &Table, index: usize) -> String {
    let id = match table.get("id").map(|n| &n.value) {
        Some(Value::Str(id)) => Some(format!("{id:?}")),
        Some(Value::Int(id)) => Some(format!("\"{id}\"")),
        _ => None,
    };
    let nested = |word: &str, label: String| {
        if parent == "topology" {
            format!("{word} {label}")
        } else {
            format!("{parent} {word} {label}")
        }
    };
    match (shape.naming, id) {
        (Naming::Fixed(name), _) => name.to_owned(),
        (Naming::Id(word), Some(id)) => format!("{word} {id}"),
        (Naming::Id(word), None) => nested(word, format!("#{}", index + 1)),
        (Naming::NestedId(word), Some(id)) => nested(word, id),
        (Naming::NestedId(word) | Naming::NestedIndex(word), _) => {
            nested(word, format!("#{}", index + 1))
        }
        (Naming::Nested(word), _) => format!("{parent} {word}"),
    }
}

/// The 1-based line and column (in characters) where `span` starts.
fn line_column(text: &str, span: &Range<usize>) -> (usize, usize) {
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_count_from_one() {
        let text = "a = 1\nbb = 2\n";
        assert_eq!(line_column(text, &(0..1)), (1, 1));
        assert_eq!(line_column(text, &(6..8)), (2, 1));
        assert_eq!(line_column(text, &(11..12)), (2, 6));
    }

    #[test]
    fn near_misspellings_are_suggested() {
        assert_eq!(distance("extent_sise", "extent_size"), 1);
        assert_eq!(
            unknown_key("extent_sise", &POOL),
            "unknown key \"extent_sise\"; did you mean \"extent_size\"?"
        );
        assert!(unknown_key("zzz", &POOL).contains("known here: name, extent_size"));
    }
}
