//! What every one-byte code of the wire (the TCP and the RoCE opcodes)
//! shares, written once: an enum of named values plus `Unknown(u8)` that
//! converts both ways without losing a byte, and prints its name.

/// Implements, for an enum `$ty` of named byte values and `Unknown(u8)`:
/// `From<u8>` (a named value never becomes `Unknown`), `From<$ty> for u8`,
/// and `Display` (the enum's `name()`, or `UNKNOWN(0x..)` with the byte).
macro_rules! byte_code {
    ($ty:ident { $($name:ident = $value:literal),* $(,)? }) => {
        impl From<u8> for $ty {
            fn from(value: u8) -> Self {
                match value {
                    $( $value => $ty::$name, )*
                    other => $ty::Unknown(other),
                }
            }
        }

        impl From<$ty> for u8 {
            fn from(value: $ty) -> u8 {
                match value {
                    $( $ty::$name => $value, )*
                    $ty::Unknown(other) => other,
                }
            }
        }

        impl core::fmt::Display for $ty {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self {
                    $ty::Unknown(v) => write!(f, "UNKNOWN({v:#04x})"),
                    known => f.write_str(known.name()),
                }
            }
        }
    };
}

pub(crate) use byte_code;
