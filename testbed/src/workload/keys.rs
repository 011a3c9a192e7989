//! Where a workload's keys live in the virtual space, what a key's value
//! looks like, and how keys are picked.

use topology::VirtAddr;

/// Bytes at the start of the space holding the shared counter words.
pub const COUNTER_AREA: u64 = 4096;
/// Shared counter words (FETCH_ADD targets of every client).
pub const COUNTERS: u64 = COUNTER_AREA / 8;
/// Words at the start of each client's slice for its own CAS / atomic
/// writes.
pub const OWN_WORDS: u64 = 64;

/// The bytes a client's keys are spread over, at most.
pub const MAX_SPREAD: u64 = 4 << 20;

/// One client's part of the virtual space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpace {
    /// First byte of the whole space: the shared counter words.
    pub counters: u64,
    /// First byte of the client's slice.
    pub start: u64,
    /// Bytes per key slot (value size rounded up to 64).
    pub slot: u64,
    /// Bytes from one key's slot to the next: the slice's room shared out
    /// evenly up to [`MAX_SPREAD`], so the keys reach every region of a
    /// small space (and clearing the slice stays cheap in a large one).
    pub stride: u64,
    /// Keys in the slice.
    pub keys: u64,
}

impl KeySpace {
    /// The slice of client `index` of `clients` in the `space` bytes from
    /// virtual address `base`, with up to `keys` values of `size` bytes.
    pub fn new(base: u64, space: u64, index: usize, clients: usize, size: u64, keys: u64) -> Self {
        let slice = (space.saturating_sub(COUNTER_AREA)) / clients.max(1) as u64;
        let slice = slice - slice % 4096;
        let start = base + COUNTER_AREA + slice * index as u64;
        let slot = Self::slot(size);
        let room = slice.saturating_sub(OWN_WORDS * 8) / slot.max(1);
        let keys = keys.min(room).max(1);
        Self {
            counters: base,
            start,
            slot,
            stride: slot * (room / keys).min(MAX_SPREAD / (keys * slot).max(1)).max(1),
            keys,
        }
    }

    /// Bytes of space in which `clients` clients each get room for `keys`
    /// values of `size` bytes (and their own words), plus the counters.
    pub fn bytes_needed(clients: usize, size: u64, keys: u64) -> u64 {
        let slice = (OWN_WORDS * 8 + keys.max(1) * Self::slot(size)).next_multiple_of(4096);
        COUNTER_AREA + slice * clients.max(1) as u64
    }

    /// Bytes per key slot: the value size rounded up to 64.
    fn slot(size: u64) -> u64 {
        size.div_ceil(64) * 64
    }

    /// Where key `k`'s value lives.
    pub fn key_addr(&self, k: u64) -> VirtAddr {
        VirtAddr(self.start + OWN_WORDS * 8 + k * self.stride)
    }

    /// The client's own atomic word `w`.
    pub fn own_word(&self, w: u64) -> VirtAddr {
        VirtAddr(self.start + 8 * (w % OWN_WORDS))
    }
}

/// Shared counter word `w` of the space starting at `base`.
pub fn counter_word(base: u64, w: u64) -> VirtAddr {
    VirtAddr(base + 8 * (w % COUNTERS))
}

/// A small deterministic generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The value of key `key` at version `version`: the version, the key, then
/// bytes derived from both, so a read proves which write it saw.
pub fn value(key: u64, version: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    let mut rng = Rng::new(key.rotate_left(17) ^ version);
    while out.len() < size {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(size);
    out
}

/// What a value read back says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Never written (all zeroes).
    Empty,
    /// The value of this version.
    Version(u64),
    /// Bytes no write of this key produced.
    Garbage,
}

/// Decodes a value read back for `key`.
pub fn decode(key: u64, bytes: &[u8]) -> Seen {
    if bytes.iter().all(|&b| b == 0) {
        return Seen::Empty;
    }
    let Some(version) = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
    else {
        return Seen::Garbage;
    };
    if value(key, version, bytes.len()) == bytes {
        Seen::Version(version)
    } else {
        Seen::Garbage
    }
}

/// What `bytes`, read back for `key`, look like, for a report that must
/// say more than "garbage": whose value they begin as, how far they follow
/// it, which version the rest is (when a later or earlier one of the same
/// key), and how many bytes at the end are zero.
pub fn describe(key: u64, bytes: &[u8]) -> String {
    let word = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let (Some(version), Some(of)) = (word(0), word(8)) else {
        return format!("{} bytes: {:02x?}", bytes.len(), bytes);
    };
    let follows = |v: &[u8], from: usize| bytes[from..] == v[from..];
    let same = bytes
        .iter()
        .zip(value(of, version, bytes.len()))
        .take_while(|(a, b)| **a == *b)
        .count();
    let whose = if of == key { "" } else { " (another key's)" };
    let mut text = format!(
        "{} bytes that begin as version {version} of key {of}{whose} and follow it for {same}",
        bytes.len()
    );
    if same < bytes.len() {
        // A torn value: is the rest a nearby version of the key? (The
        // first word may be any bytes at all: look near it only.)
        let rest = (version.saturating_sub(16).max(1)..=version.saturating_add(16))
            .find(|&w| w != version && follows(&value(of, w, bytes.len()), same));
        match rest {
            Some(w) => text.push_str(&format!("; the rest is version {w}'s")),
            None => {
                let zeros = bytes.iter().rev().take_while(|&&b| b == 0).count();
                text.push_str(&format!(
                    "; the rest is no version of it ({zeros} zero bytes at the end)"
                ));
            }
        }
    }
    text
}

/// Picks keys uniformly or with a Zipfian skew (θ = 0.99, as YCSB).
#[derive(Debug, Clone)]
pub enum KeyPicker {
    /// Every key equally likely.
    Uniform(u64),
    /// Key k with probability ∝ 1/(k+1)^θ; the cumulative weights.
    Zipfian(Vec<f64>),
}

impl KeyPicker {
    /// A picker over `keys` keys.
    pub fn new(keys: u64, zipfian: bool) -> Self {
        if !zipfian {
            return Self::Uniform(keys.max(1));
        }
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (0..keys.max(1))
            .map(|k| {
                total += 1.0 / ((k + 1) as f64).powf(0.99);
                total
            })
            .collect();
        for w in &mut cdf {
            *w /= total;
        }
        Self::Zipfian(cdf)
    }

    /// The next key.
    pub fn pick(&self, rng: &mut Rng) -> u64 {
        match self {
            Self::Uniform(n) => rng.below(*n),
            Self::Zipfian(cdf) => {
                let u = rng.unit();
                cdf.partition_point(|&w| w < u).min(cdf.len() - 1) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_says_whose_bytes_a_wrong_value_holds() {
        let (old, new) = (value(5, 1, 256), value(5, 2, 256));
        let mut torn = new.clone();
        torn[64..].copy_from_slice(&old[64..]);
        let text = describe(5, &torn);
        assert!(
            text.contains("version 2 of key 5 and follow it for 64")
                && text.contains("the rest is version 1's"),
            "{text}"
        );
        let text = describe(5, &value(9, 3, 256));
        assert!(
            text.contains("version 3 of key 9 (another key's) and follow it for 256"),
            "{text}"
        );
        let mut cut = new.clone();
        cut[128..].fill(0);
        assert!(describe(5, &cut).contains("(128 zero bytes at the end)"));
        // Bytes whose first word is huge are described at once.
        let text = describe(5, &[0xff; 256]);
        assert!(
            text.contains(&format!("version {} of key", u64::MAX)),
            "{text}"
        );
    }

    #[test]
    fn values_prove_their_key_and_version() {
        let v = value(7, 3, 100);
        assert_eq!(decode(7, &v), Seen::Version(3));
        assert_eq!(decode(8, &v), Seen::Garbage);
        let mut torn = v.clone();
        torn[60] ^= 1;
        assert_eq!(decode(7, &torn), Seen::Garbage);
        assert_eq!(decode(7, &[0; 100]), Seen::Empty);
    }

    #[test]
    fn slices_do_not_overlap() {
        let (base, space) = (1 << 40, 128 << 20);
        let a = KeySpace::new(base, space, 0, 2, 1000, 1 << 30);
        let b = KeySpace::new(base, space, 1, 2, 1000, 1 << 30);
        assert!(a.key_addr(a.keys - 1).get() + a.slot <= b.start);
        assert!(b.key_addr(b.keys - 1).get() + b.slot <= base + space);
        assert!(counter_word(base, COUNTERS - 1).get() + 8 <= a.start);
        assert!(counter_word(base, 0).get() >= base);
    }

    #[test]
    fn bytes_needed_hold_every_key_of_every_client() {
        let base = 1 << 40;
        for (clients, size, keys) in [(1, 64, 1), (2, 1000, 8192), (3, 4096, 100), (8, 1, 7)] {
            let space = KeySpace::bytes_needed(clients, size, keys);
            for index in 0..clients {
                let k = KeySpace::new(base, space, index, clients, size, keys);
                assert_eq!(k.keys, keys, "{clients} clients, {size} B, {keys} keys");
                assert!(k.key_addr(keys - 1).get() + size <= base + space);
            }
        }
    }

    #[test]
    fn zipfian_prefers_small_keys() {
        let picker = KeyPicker::new(1000, true);
        let mut rng = Rng::new(1);
        let low = (0..10_000).filter(|_| picker.pick(&mut rng) < 10).count();
        assert!(low > 2_000, "{low}");
        let uniform = KeyPicker::new(1000, false);
        let low = (0..10_000).filter(|_| uniform.pick(&mut rng) < 10).count();
        assert!(low < 300, "{low}");
    }

    #[test]
    fn keys_spread_over_a_small_space_and_stay_close_in_a_large_one() {
        let base = 1 << 40;
        // Two 2 MiB regions: the keys reach into the second.
        let small = KeySpace::new(base, 4 << 20, 0, 1, 256, 1000);
        assert!(small.key_addr(small.keys - 1).get() >= base + (2 << 20));
        assert!(small.key_addr(small.keys - 1).get() + small.slot <= base + (4 << 20));
        // A large space: at most MAX_SPREAD bytes of keys.
        let large = KeySpace::new(base, 1 << 30, 0, 1, 256, 1000);
        let span = large.key_addr(large.keys - 1).get() - large.key_addr(0).get();
        assert!(span <= MAX_SPREAD, "{span}");
        assert!(large.stride >= large.slot);
    }
}
