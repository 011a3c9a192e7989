//! Human-readable sizes (`64MiB`) and flexible 64-bit numbers (`0x1_0000_0000`).

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, written in config files as `65536`, `"64KiB"`, `"2 MiB"`,
/// `"1GiB"`, `"1GB"` (decimal) or `"0x200000"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a size or number could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseSizeError {
    /// Nothing was written.
    #[error("empty value")]
    Empty,
    /// The number part is not a number.
    #[error("{0:?} is not a number")]
    NotANumber(String),
    /// The unit is not one we know.
    #[error("unknown unit {0:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")]
    UnknownUnit(String),
    /// The value does not fit in 64 bits.
    #[error("{0:?} does not fit in 64 bits")]
    Overflow(String),
    /// A negative value where only non-negative ones make sense.
    #[error("negative value {0}: a size or number counts up from 0")]
    Negative(i64),
    /// A size written with a minus sign.
    #[error("{0:?} is negative: a size counts bytes up from 0")]
    NegativeText(String),
    /// A size with a fractional part (`1.5GiB`).
    #[error("{text:?} is not a whole number of its unit; {advice}")]
    Fraction {
        /// What was written.
        text: String,
        /// The same size in a smaller unit, or what to do instead.
        advice: String,
    },
}

/// Parses an unsigned integer written in decimal, or in hex with a `0x` prefix;
/// `_` separators are allowed.
pub fn parse_u64(text: &str) -> Result<u64, ParseSizeError> {
    let cleaned: String = text.trim().chars().filter(|c| *c != '_').collect();
    if cleaned.is_empty() {
        return Err(ParseSizeError::Empty);
    }
    let parsed = match cleaned
        .strip_prefix("0x")
        .or_else(|| cleaned.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => cleaned.parse::<u64>(),
    };
    parsed.map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow => ParseSizeError::Overflow(text.to_owned()),
        _ => ParseSizeError::NotANumber(text.to_owned()),
    })
}

impl std::str::FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ParseSizeError::Empty);
        }
        if text.starts_with("0x") || text.starts_with("0X") {
            return parse_u64(text).map(ByteSize);
        }
        if text.starts_with('-') {
            return Err(ParseSizeError::NegativeText(text.to_owned()));
        }
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '_'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        if number.is_empty() {
            return Err(ParseSizeError::NotANumber(text.to_owned()));
        }
        if let Some(fraction) = unit.strip_prefix('.') {
            return Err(fractional(text, number, fraction));
        }
        let number = parse_u64(number)?;
        let multiplier = unit_multiplier(unit.trim())
            .ok_or_else(|| ParseSizeError::UnknownUnit(unit.trim().to_owned()))?;
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| ParseSizeError::Overflow(text.to_owned()))
    }
}

/// Bytes per `unit`, for the units a size may be written in.
fn unit_multiplier(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return None,
    })
}

/// The error for `whole.fraction unit` (`1.5GiB`): the exact size in a
/// smaller unit when there is one.
fn fractional(text: &str, whole: &str, rest: &str) -> ParseSizeError {
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (digits, unit) = rest.split_at(digits_end);
    let exact = (|| {
        let multiplier = unit_multiplier(unit.trim())?;
        let scale = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
        let whole: u128 = parse_u64(whole).ok()?.into();
        let fraction: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        let scaled = whole.checked_mul(scale)?.checked_add(fraction)?;
        let bytes = scaled.checked_mul(multiplier.into())?;
        if bytes % scale != 0 {
            return None;
        }
        u64::try_from(bytes / scale).ok()
    })();
    let advice = match exact {
        Some(bytes) => format!("write {}", ByteSize(bytes)),
        None => "write it in a smaller unit (1536MiB for 1.5GiB) or in bytes".to_owned(),
    };
    ParseSizeError::Fraction {
        text: text.to_owned(),
        advice,
    }
}

/// For a size that is a whole number of a decimal unit (`64MB`), the hint
/// that the unit is decimal and the binary one is probably meant:
/// `64MB is 64,000,000 bytes; did you mean 64MiB?`.
pub fn decimal_unit_hint(bytes: u64) -> Option<String> {
    const UNITS: [(&str, u64, &str); 4] = [
        ("TB", 1_000_000_000_000, "TiB"),
        ("GB", 1_000_000_000, "GiB"),
        ("MB", 1_000_000, "MiB"),
        ("KB", 1_000, "KiB"),
    ];
    UNITS
        .into_iter()
        .find(|(_, unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
        .map(|(name, unit, binary)| {
            let n = bytes / unit;
            format!(
                "{n}{name} is {} bytes; did you mean {n}{binary}?",
                thousands(bytes)
            )
        })
}

/// `64000000` as `64,000,000`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that divides the size exactly (`64MiB`, `1536KiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, unit) in UNITS {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{}", self.0 / unit, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// A visitor that accepts an integer or a string parsed by `parse`.
struct FlexVisitor<F>(F, &'static str);

impl<F: Fn(&str) -> Result<u64, ParseSizeError>> Visitor<'_> for FlexVisitor<F> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(ParseSizeError::Negative(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        (self.0)(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FlexVisitor(
            |s: &str| s.parse::<ByteSize>().map(ByteSize::bytes),
            "a size such as 65536 or \"64MiB\"",
        ))
        .map(ByteSize)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Serde helpers for a `u64` written as an integer or a (hex) string, for
/// values such as keys and addresses that do not fit TOML's signed integers.
/// Written back as a hex string.
pub mod flex_u64 {
    use super::*;

    /// Reads an integer, or a string such as `"0xdead_beef"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(FlexVisitor(
            parse_u64,
            "an integer or a string such as \"0x1000\"",
        ))
    }

    /// Writes the value as a hex string.
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:#x}"))
    }
}

/// [`flex_u64`] for optional values.
pub mod flex_u64_opt {
    use super::*;

    /// Reads a present value as [`flex_u64::deserialize`] does.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        flex_u64::deserialize(d).map(Some)
    }

    /// Writes a present value as a hex string.
    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => flex_u64::serialize(v, s),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        let cases = [
            ("65536", 65536),
            ("64KiB", 64 << 10),
            ("2 MiB", 2 << 20),
            ("1GiB", 1 << 30),
            ("1_024B", 1024),
            ("3MB", 3_000_000),
            ("0x200000", 2 << 20),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(want)), "{text}");
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!("".parse::<ByteSize>(), Err(ParseSizeError::Empty));
        assert!(matches!(
            "12 parsecs".parse::<ByteSize>(),
            Err(ParseSizeError::UnknownUnit(_))
        ));
        assert!(matches!(
            "MiB".parse::<ByteSize>(),
            Err(ParseSizeError::NotANumber(_))
        ));
        assert!(matches!(
            "99999999TiB".parse::<ByteSize>(),
            Err(ParseSizeError::Overflow(_))
        ));
        assert!(matches!(
            "0xZZ".parse::<ByteSize>(),
            Err(ParseSizeError::NotANumber(_))
        ));
    }

    #[test]
    fn says_why_a_size_is_not_one() {
        assert_eq!(
            "abc".parse::<ByteSize>().unwrap_err().to_string(),
            "\"abc\" is not a number"
        );
        assert_eq!(
            "-64MiB".parse::<ByteSize>().unwrap_err().to_string(),
            "\"-64MiB\" is negative: a size counts bytes up from 0"
        );
        assert_eq!(
            "1.5GiB".parse::<ByteSize>().unwrap_err().to_string(),
            "\"1.5GiB\" is not a whole number of its unit; write 1536MiB"
        );
        let odd = "1.3B".parse::<ByteSize>().unwrap_err().to_string();
        assert!(odd.contains("smaller unit"), "{odd}");
    }

    #[test]
    fn decimal_units_get_a_hint() {
        assert_eq!(
            decimal_unit_hint(64_000_000).as_deref(),
            Some("64MB is 64,000,000 bytes; did you mean 64MiB?")
        );
        assert_eq!(decimal_unit_hint(64 << 20), None);
        assert_eq!(thousands(1_234), "1,234");
        assert_eq!(thousands(999), "999");
    }

    #[test]
    fn displays_largest_exact_unit() {
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1536 << 10).to_string(), "1536KiB");
        assert_eq!(ByteSize(100).to_string(), "100B");
        assert_eq!(ByteSize(0).to_string(), "0B");
    }

    #[test]
    fn display_round_trips() {
        for v in [0u64, 1, 4096, 3 << 30, 12345] {
            assert_eq!(ByteSize(v).to_string().parse::<ByteSize>(), Ok(ByteSize(v)));
        }
    }
}
