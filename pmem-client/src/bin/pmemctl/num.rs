//! Numbers on the command line: addresses, lengths and atomic operands.
//!
//! A number is a sum of terms, each a decimal or `0x` hex integer with an
//! optional size unit (`4096`, `0x1000`, `64MiB`, `1TiB`), joined by `+` or
//! `-`: `1TiB+4MiB-100KiB`. Nothing is relative: `0` is address 0.

use topology::ByteSize;

/// Parses a number as described in the module docs; the error says what is
/// wrong, for clap to print.
pub fn parse_number(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty number".to_owned());
    }
    let mut total: u64 = 0;
    for (i, (sign, term)) in terms(trimmed).into_iter().enumerate() {
        if term.trim().is_empty() {
            let place = if i == 0 { "before" } else { "after" };
            return Err(format!("{text:?}: a number is missing {place} a sign"));
        }
        let value = term
            .parse::<ByteSize>()
            .map_err(|e| {
                if term.trim() == trimmed {
                    e.to_string()
                } else {
                    format!("{text:?}: {e}")
                }
            })?
            .bytes();
        total = match sign {
            Sign::Plus => total
                .checked_add(value)
                .ok_or_else(|| format!("{text:?} does not fit in 64 bits"))?,
            Sign::Minus => total
                .checked_sub(value)
                .ok_or_else(|| format!("{text:?} is negative"))?,
        };
    }
    Ok(total)
}

/// Parses an atomic operand: a number as [`parse_number`] reads it, or a
/// negative decimal number (`-1`), taken in two's complement so that
/// `faa ADDR -1` subtracts one.
pub fn parse_operand(text: &str) -> Result<u64, String> {
    match text.trim().strip_prefix('-') {
        Some(rest) if !rest.trim().is_empty() => {
            let magnitude = parse_number(rest)?;
            if magnitude > 1u64 << 63 {
                return Err(format!("{text:?} does not fit in 64 bits"));
            }
            Ok(magnitude.wrapping_neg())
        }
        _ => parse_number(text),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sign {
    Plus,
    Minus,
}

/// Splits `text` at `+` and `-` into signed terms; the first is positive.
fn terms(text: &str) -> Vec<(Sign, &str)> {
    let mut out = Vec::new();
    let mut sign = Sign::Plus;
    let mut start = 0;
    for (at, c) in text.char_indices() {
        let next = match c {
            '+' => Sign::Plus,
            '-' => Sign::Minus,
            _ => continue,
        };
        out.push((sign, &text[start..at]));
        sign = next;
        start = at + c.len_utf8();
    }
    out.push((sign, &text[start..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hex_decimal_sizes_and_sums() {
        let cases = [
            ("0", 0),
            ("4096", 4096),
            ("0x10000001000", 0x100_0000_1000),
            ("0X1f", 31),
            ("1_000", 1000),
            ("64MiB", 64 << 20),
            ("1TiB", 1 << 40),
            ("1TiB+4KiB", (1 << 40) + 4096),
            ("1TiB + 4MiB - 100KiB", (1 << 40) + (4 << 20) - (100 << 10)),
            ("0x10000000000+0x10", (1 << 40) + 16),
            (" 16 ", 16),
        ];
        for (text, want) in cases {
            assert_eq!(parse_number(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_garbage_with_a_reason() {
        for text in [
            "",
            " ",
            "zebra",
            "0xZZ",
            "12 parsecs",
            "1TiB+",
            "+1",
            "1--2",
            "-5",
            "4-5",
            "99999999TiB",
            "0xffffffffffffffff+1",
        ] {
            let err = parse_number(text).expect_err(text);
            assert!(!err.is_empty(), "{text}");
        }
        assert!(
            parse_number("4-5")
                .expect_err("negative")
                .contains("negative")
        );
        assert!(
            parse_number("0xffffffffffffffff+1")
                .expect_err("overflow")
                .contains("64 bits")
        );
    }

    #[test]
    fn a_word_is_not_a_number() {
        assert_eq!(
            parse_operand("abc"),
            Err("\"abc\" is not a number".to_owned())
        );
        assert_eq!(
            parse_number("1TiB+abc"),
            Err("\"1TiB+abc\": \"abc\" is not a number".to_owned())
        );
    }

    #[test]
    fn operands_may_be_negative() {
        assert_eq!(parse_operand("5"), Ok(5));
        assert_eq!(parse_operand("-1"), Ok(u64::MAX));
        assert_eq!(parse_operand("-0x10"), Ok(16u64.wrapping_neg()));
        assert_eq!(parse_operand("0xffffffffffffffff"), Ok(u64::MAX));
        assert!(parse_operand("-").is_err());
        assert!(parse_operand("-x").is_err());
    }
}
