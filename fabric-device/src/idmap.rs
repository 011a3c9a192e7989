//! Hash maps keyed by the device's own small integer ids (connection ids,
//! link ids, link tags), with a multiplicative hash instead of SipHash: the
//! keys are not chosen by peers, so flooding is not a concern, and every
//! forwarded request looks several of them up.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for integer keys: one multiplication by a 64-bit odd constant.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by device-assigned integer ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_buckets() {
        let mut map: IdMap<u64, u64> = IdMap::default();
        for i in 0..10_000 {
            map.insert(i, i * 2);
        }
        assert!((0..10_000).all(|i| map[&i] == i * 2));
        let low_bits: std::collections::HashSet<u64> = (0..1024u64)
            .map(|i| {
                let mut h = IdHasher::default();
                h.write_u64(i);
                h.finish() >> 54
            })
            .collect();
        assert!(
            low_bits.len() > 500,
            "the top bits differ for sequential keys"
        );
    }
}
