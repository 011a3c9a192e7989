//! The Prometheus text exposition format, version 0.0.4: escaping, numbers and
//! the lines of one metric family.

use std::fmt::{self, Display, Write};

/// An `f64` spelled so Prometheus parses it: `+Inf`, `-Inf`, `NaN`, plain
/// decimals for ordinary magnitudes (`3`, not `3.0`), and an exponent only for
/// very large or very small ones.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromF64(pub(crate) f64);

impl Display for PromF64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0;
        if value.is_nan() {
            f.write_str("NaN")
        } else if value.is_infinite() {
            f.write_str(if value > 0.0 { "+Inf" } else { "-Inf" })
        } else if value != 0.0 && !(1e-6..1e21).contains(&value.abs()) {
            write!(f, "{value:e}")
        } else {
            write!(f, "{value}")
        }
    }
}

/// Appends the `# HELP` and `# TYPE` lines of a family.
pub(crate) fn write_header(out: &mut String, name: &str, help: &str, type_name: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    write_escaped(out, help, false);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(type_name);
    out.push('\n');
}

/// Appends one sample line: `name` + `suffix`, the labels (then `extra`, e.g. a
/// histogram's `le`) in braces when there are any, and the value.
pub(crate) fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    extra: Option<(&str, &str)>,
    value: impl Display,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut all = labels.iter().copied().chain(extra);
    if let Some(first) = all.next() {
        out.push('{');
        write_label(out, first);
        for label in all {
            out.push(',');
            write_label(out, label);
        }
        out.push('}');
    }
    // Writing to a `String` cannot fail.
    let _ = writeln!(out, " {value}");
}

fn write_label(out: &mut String, (name, value): (&str, &str)) {
    out.push_str(name);
    out.push_str("=\"");
    write_escaped(out, value, true);
    out.push('"');
}

/// Escapes backslash and line feed (HELP text), and also the double quote
/// (label values) when `quote` is set.
fn write_escaped(out: &mut String, text: &str, quote: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_for_prometheus() {
        let cases = [
            (0.0, "0"),
            (3.0, "3"),
            (-2.5, "-2.5"),
            (0.25, "0.25"),
            (1e-6, "0.000001"),
            (2.5e-7, "2.5e-7"),
            (1e21, "1e21"),
            (123_456_789.0, "123456789"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ];
        for (value, spelled) in cases {
            assert_eq!(PromF64(value).to_string(), spelled, "{value:?}");
        }
    }

    #[test]
    fn escaping() {
        let mut out = String::new();
        write_header(&mut out, "m", "a \\ b\nc \"q\"", "gauge");
        write_sample(&mut out, "m", "", &[("path", "C:\\x\n\"y\"")], None, 1);
        assert_eq!(
            out,
            "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\nm{path=\"C:\\\\x\\n\\\"y\\\"\"} 1\n"
        );
    }

    #[test]
    fn sample_with_extra_label_only() {
        let mut out = String::new();
        write_sample(&mut out, "h", "_bucket", &[], Some(("le", "+Inf")), 4);
        assert_eq!(out, "h_bucket{le=\"+Inf\"} 4\n");
    }
}
