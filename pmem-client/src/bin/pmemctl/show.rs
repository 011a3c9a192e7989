//! How pmemctl shows things: hex dumps, aligned tables, numbers.

use std::fmt::Write as _;
use std::io;

/// Bytes per hex dump line.
pub const DUMP_WIDTH: usize = 16;

/// Writes a hex dump of `data` read at `base` to `out`, line by line: one
/// line per 16 bytes, the virtual address of its first byte, the bytes in
/// hex (two groups of eight), and the printable ASCII ones between bars (`.`
/// for the rest):
///
/// ```text
/// 0x10000000000  68 65 6c 6c 6f 00 00 00  00 00 00 00 00 00 00 00  |hello...........|
/// ```
///
/// Every address has as many digits as the last one, so the columns line up.
pub fn write_hex_dump(out: &mut impl io::Write, base: u64, data: &[u8]) -> io::Result<()> {
    let last = base.saturating_add(data.len().saturating_sub(1) as u64);
    let digits = format!("{last:x}").len();
    let mut text = String::new();
    for (i, line) in data.chunks(DUMP_WIDTH).enumerate() {
        text.clear();
        let addr = base.wrapping_add((i * DUMP_WIDTH) as u64);
        // `write!` to a String cannot fail.
        let _ = write!(text, "0x{addr:0digits$x} ");
        for column in 0..DUMP_WIDTH {
            if column % 8 == 0 {
                text.push(' ');
            }
            match line.get(column) {
                Some(byte) => {
                    let _ = write!(text, "{byte:02x} ");
                }
                None => text.push_str("   "),
            }
        }
        text.push_str(" |");
        text.extend(line.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        }));
        text.push_str("|\n");
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// `7 (0x7)`.
pub fn value(v: u64) -> String {
    format!("{v} ({v:#x})")
}

/// A size in bytes, with its binary unit when it has one: `64 bytes`,
/// `3145728 bytes (3MiB)`.
pub fn size(bytes: u64) -> String {
    let unit = topology::ByteSize(bytes).to_string();
    if unit.ends_with("iB") {
        format!("{bytes} bytes ({unit})")
    } else if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

/// `[start, start + len)` as `0x…..0x…`.
pub fn range(start: u64, len: u64) -> String {
    format!("{start:#x}..{:#x}", start.saturating_add(len))
}

/// Rows under a header, each column as wide as its widest cell, two spaces
/// apart, no trailing blanks.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(cell.chars().count()),
                None => widths.push(cell.chars().count()),
            }
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let width = widths.get(i).copied().unwrap_or(0);
            let _ = write!(line, "{cell:width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_dump(base: u64, data: &[u8]) -> String {
        let mut out = Vec::new();
        write_hex_dump(&mut out, base, data).expect("write to a Vec");
        String::from_utf8(out).expect("a dump is ASCII")
    }

    #[test]
    fn dump_lines_have_address_hex_and_gutter() {
        let dump = hex_dump(0x100_0000_0000, b"hello, pmem!\x00\x01\x7f\xffAB");
        let lines: Vec<&str> = dump.lines().collect();
        assert_eq!(
            lines,
            [
                "0x10000000000  68 65 6c 6c 6f 2c 20 70  6d 65 6d 21 00 01 7f ff  |hello, pmem!....|",
                "0x10000000010  41 42                                             |AB|",
            ]
        );
        assert_eq!(lines[0].find('|'), lines[1].find('|'), "gutters line up");
    }

    #[test]
    fn dump_addresses_share_a_width() {
        let dump = hex_dump(0xff0, &[0u8; 32]);
        let starts: Vec<&str> = dump.lines().map(|l| &l[..6]).collect();
        assert_eq!(starts, ["0x0ff0", "0x1000"]);
        let dump = hex_dump(0, &[1u8; 17]);
        assert!(dump.starts_with("0x00  01 01"), "{dump}");
        assert!(dump.contains("\n0x10  01 "), "{dump}");
        assert_eq!(hex_dump(5, &[]), "");
    }

    #[test]
    fn tables_align_columns() {
        let text = table(
            &["ID", "SIZE"],
            &[
                vec!["A1".into(), "4MiB".into()],
                vec!["LONGER".into(), "1".into()],
            ],
        );
        assert_eq!(text, "ID      SIZE\nA1      4MiB\nLONGER  1\n");
    }

    #[test]
    fn values_and_ranges() {
        assert_eq!(value(255), "255 (0xff)");
        assert_eq!(range(0x1000, 0x10), "0x1000..0x1010");
        assert_eq!(size(1), "1 byte");
        assert_eq!(size(64), "64 bytes");
        assert_eq!(size(1000), "1000 bytes");
        assert_eq!(size(3 << 20), "3145728 bytes (3MiB)");
        assert_eq!(size(1536), "1536 bytes");
        assert_eq!(size(3 << 10), "3072 bytes (3KiB)");
    }
}
