//! 24-bit packet sequence numbers with wrap-around.

use core::fmt;

/// A packet sequence number: 24 bits, compared within half the space
/// (2^23), as RC requires, so that the order holds across wrap-around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    const MASK: u32 = Self::MODULUS - 1;
    const HALF: u32 = Self::MODULUS / 2;

    /// A PSN from the low 24 bits of `value`.
    pub const fn new(value: u32) -> Self {
        Psn(value & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// This PSN plus `n`, wrapping.
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// This PSN minus `n`, wrapping.
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How far `self` is ahead of `base`, modulo 2^24 (0 when equal).
    pub const fn distance_from(self, base: Psn) -> u32 {
        self.0.wrapping_sub(base.0) & Self::MASK
    }

    /// Whether `self` comes before `other` (within half the PSN space).
    pub const fn is_before(self, other: Psn) -> bool {
        let d = other.distance_from(self);
        d != 0 && d < Self::HALF
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        let last = Psn::new(0xFF_FFFF);
        assert_eq!(last.next(), Psn::new(0));
        assert_eq!(Psn::new(0x1_000_005), Psn::new(5));
        assert_eq!(Psn::new(2).sub(3), last);
        assert_eq!(Psn::new(1).distance_from(last), 2);
    }

    #[test]
    fn order_holds_across_wrap() {
        let last = Psn::new(0xFF_FFFF);
        assert!(last.is_before(Psn::new(0)));
        assert!(!Psn::new(0).is_before(last));
        assert!(!Psn::new(7).is_before(Psn::new(7)));
        assert!(Psn::new(0).is_before(Psn::new((1 << 23) - 1)));
        assert!(!Psn::new(0).is_before(Psn::new(1 << 23)));
    }
}
