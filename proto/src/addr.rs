//! Address newtypes for the three address spaces of the design.
//!
//! A [`VirtAddr`] is what an application uses, a [`PmemAddr`] is a location in
//! the flat pool-wide PMEM space, and a [`RegionOffset`] is what a server sees:
//! a region index plus a byte offset inside that region. They are distinct
//! types so that one can never be passed where another is meant. An
//! [`AccessKey`] is what opens a range to a request.

use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// An address in the shared virtual address space that applications use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct VirtAddr(pub u64);

/// An address in the flat, pool-wide PMEM address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PmemAddr(pub u64);

/// The wire-level index of a region: its position in the layout.
///
/// Stable as long as regions are only appended to the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RegionIndex(pub u32);

/// A location inside one region: what a PMEM server executes requests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RegionOffset {
    /// Which region.
    pub region: RegionIndex,
    /// Byte offset from the start of the region's data.
    pub offset: u64,
}

/// The key a request carries to reach memory: the key of its region, or
/// with an allocator the key of the allocation it touches. Servers make
/// region keys at random; [`AccessKey::NONE`] (0) is never a valid key and
/// stands for "not given" in a MAP or "the region's key" inside a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AccessKey(pub u64);

impl AccessKey {
    /// No key: not given, or not known yet.
    pub const NONE: AccessKey = AccessKey(0);

    /// The key's bits, as they go on the wire.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether this is [`AccessKey::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl From<u64> for AccessKey {
    fn from(bits: u64) -> Self {
        Self(bits)
    }
}

impl fmt::Display for AccessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

macro_rules! addr_ops {
    ($name:ident) => {
        impl $name {
            /// The raw address value.
            pub const fn get(self) -> u64 {
                self.0
            }

            /// This address moved forward by `bytes`, or `None` on overflow.
            pub const fn checked_add(self, bytes: u64) -> Option<Self> {
                match self.0.checked_add(bytes) {
                    Some(v) => Some(Self(v)),
                    None => None,
                }
            }

            /// This address moved back by `bytes`, or `None` below 0.
            pub const fn checked_sub(self, bytes: u64) -> Option<Self> {
                match self.0.checked_sub(bytes) {
                    Some(v) => Some(Self(v)),
                    None => None,
                }
            }

            /// Bytes from `base` up to this address, or `None` when `base` is above it.
            pub const fn checked_offset_from(self, base: Self) -> Option<u64> {
                self.0.checked_sub(base.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }

        /// The address `bytes` further on. Panics when it would pass the end of
        /// the 64-bit space, as `Instant + Duration` does; `checked_add` says
        /// `None` instead.
        impl Add<u64> for $name {
            type Output = Self;

            fn add(self, bytes: u64) -> Self {
                match self.checked_add(bytes) {
                    Some(next) => next,
                    None => panic!("{} + {bytes:#x} passes the end of the address space", self),
                }
            }
        }

        /// Moves the address `bytes` further on; panics as `+` does.
        impl AddAssign<u64> for $name {
            fn add_assign(&mut self, bytes: u64) {
                *self = *self + bytes;
            }
        }

        /// The address `bytes` before. Panics below 0; `checked_sub` says
        /// `None` instead.
        impl Sub<u64> for $name {
            type Output = Self;

            fn sub(self, bytes: u64) -> Self {
                match self.checked_sub(bytes) {
                    Some(before) => before,
                    None => panic!("{} - {bytes:#x} goes below address 0", self),
                }
            }
        }

        /// Moves the address `bytes` back; panics as `-` does.
        impl SubAssign<u64> for $name {
            fn sub_assign(&mut self, bytes: u64) {
                *self = *self - bytes;
            }
        }

        /// Bytes from `base` up to this address. Panics when `base` is above
        /// it; `checked_offset_from` says `None` instead.
        impl Sub for $name {
            type Output = u64;

            fn sub(self, base: Self) -> u64 {
                match self.checked_offset_from(base) {
                    Some(bytes) => bytes,
                    None => panic!("{} - {}: the base is above the address", self, base),
                }
            }
        }
    };
}

addr_ops!(VirtAddr);
addr_ops!(PmemAddr);

impl RegionOffset {
    /// A location `offset` bytes into `region`.
    pub const fn new(region: RegionIndex, offset: u64) -> Self {
        Self { region, offset }
    }
}

impl fmt::Display for RegionIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl fmt::Display for RegionOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{:#x}", self.region, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_is_checked() {
        assert_eq!(PmemAddr(10).checked_add(5), Some(PmemAddr(15)));
        assert_eq!(PmemAddr(u64::MAX).checked_add(1), None);
        assert_eq!(PmemAddr(15).checked_offset_from(PmemAddr(10)), Some(5));
        assert_eq!(PmemAddr(5).checked_offset_from(PmemAddr(10)), None);
    }

    #[test]
    fn operators_move_addresses_and_measure_between_them() {
        let base = VirtAddr(0x1000);
        assert_eq!(base + 0x40, VirtAddr(0x1040));
        let mut at = base;
        at += 8;
        at += 8;
        assert_eq!(at, VirtAddr(0x1010));
        assert_eq!(at - base, 0x10);
        assert_eq!(base - base, 0);
        assert_eq!(PmemAddr(7) + 1 - PmemAddr(7), 1);
        assert_eq!(base + 0x40 - 0x10, VirtAddr(0x1030));
        at -= 0x10;
        assert_eq!(at, base);
        assert_eq!(base.checked_sub(0x1000), Some(VirtAddr(0)));
        assert_eq!(base.checked_sub(0x1001), None);
        assert_eq!(
            VirtAddr(u64::MAX - 1).checked_add(1),
            Some(VirtAddr(u64::MAX))
        );
        assert_eq!(VirtAddr(u64::MAX).checked_add(1), None);
    }

    #[test]
    #[should_panic(expected = "passes the end of the address space")]
    fn adding_past_the_end_panics() {
        let _ = VirtAddr(u64::MAX) + 1;
    }

    #[test]
    #[should_panic(expected = "goes below address 0")]
    fn subtracting_below_zero_panics() {
        let _ = VirtAddr(0x10) - 0x11;
    }

    #[test]
    #[should_panic(expected = "the base is above the address")]
    fn a_difference_below_zero_panics() {
        let _ = VirtAddr(0x10) - VirtAddr(0x20);
    }

    #[test]
    fn display_is_hex() {
        assert_eq!(PmemAddr(0x1000).to_string(), "0x1000");
        assert_eq!(VirtAddr(0x20).to_string(), "0x20");
        assert_eq!(
            RegionOffset::new(RegionIndex(3), 0x40).to_string(),
            "#3+0x40"
        );
    }
}
