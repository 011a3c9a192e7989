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
    #[error("negative value {0}")]
    Negative(i64),
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
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '_'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number = parse_u64(number)?;
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => return Err(ParseSizeError::UnknownUnit(other.to_owned())),
        };
        number
            .checked_mul(multiplier)
            .map(ByteSize)
            .ok_or_else(|| ParseSizeError::Overflow(text.to_owned()))
    }
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
            Err(ParseSizeError::Empty)
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
