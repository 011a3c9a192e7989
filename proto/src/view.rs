//! The part every wire view shares, written once: a `Packet`-style struct
//! over a byte buffer with `new_unchecked`, `new_checked` and `into_inner`.
//!
//! A view of a fixed size (`exactly`) or of a fixed part and a payload
//! (`at_least` with `payload`) gets its `check_len` from the macro too; the
//! others (a size their fields announce, a header to validate) write their
//! own, with [`len_at_least`], [`len_exactly`] and [`len_as_announced`],
//! which state the common size rules once.

use crate::error::{Error, Result};

/// Defines a read/write view `$name<T: AsRef<[u8]>>` over a buffer, with
/// `new_unchecked`, `new_checked` (which runs the view's own
/// `check_len(&self) -> Result<(), $error>`) and `into_inner`; given a
/// `payload` range (the bytes after a fixed part, at least `at_least`
/// bytes long), `check_len`, `payload` and `payload_mut` too; given
/// `exactly` a size, the `check_len` of a body of that size.
macro_rules! wire_view {
    ($(#[$attr:meta])* pub struct $name:ident; error: $error:ty;) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checks, for one the caller sized;
            /// accessors may panic if it is malformed.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            #[doc = concat!(
                "Wraps a buffer after [`", stringify!($name),
                "::check_len`]; no accessor panics afterwards."
            )]
            pub fn new_checked(buffer: T) -> core::result::Result<Self, $error> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
    (
        $(#[$attr:meta])* pub struct $name:ident; error: $error:ty;
        exactly: $len:expr, $what:literal;
    ) => {
        wire_view! { $(#[$attr])* pub struct $name; error: $error; }

        impl<T: AsRef<[u8]>> $name<T> {
            #[doc = concat!("Checks that the body is exactly [`", stringify!($len), "`] bytes.")]
            pub fn check_len(&self) -> core::result::Result<(), $error> {
                $crate::view::len_exactly(self.buffer.as_ref().len(), $len, $what)
            }
        }
    };
    (
        $(#[$attr:meta])* pub struct $name:ident; error: $error:ty;
        at_least: $len:expr; payload: $payload:expr;
    ) => {
        wire_view! { $(#[$attr])* pub struct $name; error: $error; }

        impl<T: AsRef<[u8]>> $name<T> {
            #[doc = concat!(
                "Checks that the fixed part ([`", stringify!($len), "`] bytes) is there."
            )]
            pub fn check_len(&self) -> core::result::Result<(), $error> {
                $crate::view::len_at_least(self.buffer.as_ref().len(), $len)
            }
        }

        impl<'a, T: AsRef<[u8]> + ?Sized> $name<&'a T> {
            /// The bytes after the fixed part.
            pub fn payload(&self) -> &'a [u8] {
                &self.buffer.as_ref()[$payload]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The bytes after the fixed part, mutably.
            pub fn payload_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$payload]
            }
        }
    };
}

pub(crate) use wire_view;

/// `Truncated` unless `len` bytes hold a structure of `needed` bytes.
pub(crate) fn len_at_least(len: usize, needed: usize) -> Result<()> {
    if len < needed {
        return Err(Error::Truncated { needed, got: len });
    }
    Ok(())
}

/// `Truncated` when `len` is short of `expected`, `LengthMismatch` (naming
/// `what`) when it is longer: for a structure of a fixed size.
pub(crate) fn len_exactly(len: usize, expected: usize, what: &'static str) -> Result<()> {
    len_at_least(len, expected)?;
    len_as_announced(len, expected, what)
}

/// `LengthMismatch` (naming `what`) unless `len` is the `announced` size,
/// the one a fixed part's own count fields give.
pub(crate) fn len_as_announced(len: usize, announced: usize, what: &'static str) -> Result<()> {
    if len != announced {
        return Err(Error::LengthMismatch {
            what,
            expected: announced,
            got: len,
        });
    }
    Ok(())
}
