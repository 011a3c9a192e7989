//! Whether a write asks its server to store around the server's CPU cache.
//!
//! A server stores a write's bytes either with ordinary stores, which leave
//! them in its CPU cache, or with non-temporal stores, which stream them to
//! memory and leave the cache to the data that is read again. A bulk write
//! (a log segment, a checkpoint, a copied object) is rarely read back soon
//! and would push the small hot words of other clients out of the cache; a
//! small write is often read or updated again. The request's NON_TEMPORAL
//! flag carries the choice; the server also uses non-temporal stores for
//! every write to a region its topology marks `cache = "non-temporal"`.

use std::fmt;
use std::str::FromStr;

/// How a pool's writes ask the server to treat its CPU cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerCache {
    /// Writes of at least [`PoolOptions::non_temporal_from`] bytes ask for
    /// non-temporal stores, smaller ones do not.
    ///
    /// [`PoolOptions::non_temporal_from`]: super::PoolOptions::non_temporal_from
    #[default]
    Auto,
    /// No write asks for non-temporal stores: the server stores as the
    /// region's own policy says (ordinary stores unless the topology marks
    /// the region non-temporal).
    Cached,
    /// Every write asks for non-temporal stores.
    NonTemporal,
}

/// The size from which [`ServerCache::Auto`] asks for non-temporal stores
/// by default: 64 KiB, far more than a hot record and a small part of a
/// server's last-level cache.
pub const NON_TEMPORAL_FROM: u64 = 64 * 1024;

impl ServerCache {
    /// Every policy, in the order the command lines list them.
    pub const ALL: [ServerCache; 3] = [
        ServerCache::Auto,
        ServerCache::Cached,
        ServerCache::NonTemporal,
    ];

    /// Whether a write of `len` bytes asks for non-temporal stores, with
    /// `Auto` switching at `from` bytes.
    pub fn non_temporal(self, len: u64, from: u64) -> bool {
        match self {
            ServerCache::Auto => len >= from,
            ServerCache::Cached => false,
            ServerCache::NonTemporal => true,
        }
    }

    /// The name command lines use: `auto`, `cached` or `non-temporal`.
    pub fn name(self) -> &'static str {
        match self {
            ServerCache::Auto => "auto",
            ServerCache::Cached => "cached",
            ServerCache::NonTemporal => "non-temporal",
        }
    }
}

impl fmt::Display for ServerCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`ServerCache`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown server cache policy {0:?}: use auto, cached or non-temporal")]
pub struct UnknownServerCache(pub String);

impl FromStr for ServerCache {
    type Err = UnknownServerCache;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|policy| policy.name() == s)
            .ok_or_else(|| UnknownServerCache(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_bypasses_the_cache_from_the_threshold_on() {
        let from = NON_TEMPORAL_FROM;
        assert!(!ServerCache::Auto.non_temporal(64, from));
        assert!(!ServerCache::Auto.non_temporal(from - 1, from));
        assert!(ServerCache::Auto.non_temporal(from, from));
        assert!(ServerCache::Auto.non_temporal(16 << 20, from));
        assert!(
            ServerCache::Auto.non_temporal(8, 8),
            "the threshold is a setting"
        );
    }

    #[test]
    fn cached_and_non_temporal_ignore_the_size() {
        for len in [0, 8, NON_TEMPORAL_FROM, 16 << 20] {
            assert!(!ServerCache::Cached.non_temporal(len, NON_TEMPORAL_FROM));
            assert!(ServerCache::NonTemporal.non_temporal(len, NON_TEMPORAL_FROM));
        }
    }

    #[test]
    fn names_round_trip_and_a_wrong_one_lists_the_right_ones() {
        for policy in ServerCache::ALL {
            assert_eq!(policy.name().parse(), Ok(policy));
            assert_eq!(policy.to_string(), policy.name());
        }
        let err = "nt".parse::<ServerCache>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown server cache policy \"nt\": use auto, cached or non-temporal"
        );
    }
}
