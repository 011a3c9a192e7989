//! The region keys this client was given.
//!
//! Servers make their regions' keys (random, kept with the region, rotated
//! by operators) and hand them out in the MAP: a fabric device passes on
//! those of the regions the client's grants reach. A key of 0 in a
//! translation or an allocator record ([`AccessKey::NONE`]) stands for "the region's key", looked
//! up here when the request is sent, so a rotated key is picked up by
//! learning the new MAP, without touching translations.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use topology::{AccessKey, Layout, RegionIndex};

/// How often at most the keys of one region are asked for again after a
/// refusal: a client without a grant must not turn each refused request
/// into MAP requests.
const REFRESH_INTERVAL: Duration = Duration::from_millis(500);

/// The current key of every region (0 while not given).
#[derive(Debug)]
pub(crate) struct RegionKeys {
    keys: Vec<AtomicU64>,
    /// When each region's keys were last asked for again.
    refreshed: Mutex<Vec<Option<Instant>>>,
}

impl RegionKeys {
    /// No keys yet, for `regions` regions.
    pub fn new(regions: usize) -> Self {
        Self {
            keys: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            refreshed: Mutex::new(vec![None; regions]),
        }
    }

    /// The keys for `layout`, a later epoch of `before`'s map: a region
    /// both have keeps its key (found by its id: its index may differ),
    /// new regions have none yet.
    pub fn carried(&self, before: &Layout, layout: &Layout) -> Self {
        let keys = Self::new(layout.entries().len());
        for (slot, entry) in keys.keys.iter().zip(layout.entries()) {
            if let Some(old) = before.entry_by_id(&entry.region_id) {
                slot.store(self.get(old.region).get(), Ordering::Release);
            }
        }
        keys
    }

    /// Records the keys `map` gives; returns how many changed.
    pub fn learn(&self, map: &proto::map::Repr) -> usize {
        map.entries
            .iter()
            .filter(|e| !e.key.is_none())
            .filter_map(|e| self.keys.get(e.region.0 as usize).map(|k| (k, e.key.get())))
            .filter(|(slot, key)| slot.swap(*key, Ordering::AcqRel) != *key)
            .count()
    }

    /// The key to send for a request carrying `key` into `region`: `key`
    /// itself (an allocation's own key), or for none the region's key.
    pub fn resolve(&self, region: RegionIndex, key: AccessKey) -> AccessKey {
        match key {
            AccessKey::NONE => self.get(region),
            key => key,
        }
    }

    /// The region's key as last learnt ([`AccessKey::NONE`]: not given).
    pub fn get(&self, region: RegionIndex) -> AccessKey {
        AccessKey(
            self.keys
                .get(region.0 as usize)
                .map_or(0, |k| k.load(Ordering::Acquire)),
        )
    }

    /// Whether `region`'s keys may be asked for again now (at most once
    /// per [`REFRESH_INTERVAL`]); records the attempt when they may.
    pub fn may_refresh(&self, region: RegionIndex, now: Instant) -> bool {
        let mut refreshed = self
            .refreshed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(last) = refreshed.get_mut(region.0 as usize) else {
            return false;
        };
        if last.is_some_and(|at| now.saturating_duration_since(at) < REFRESH_INTERVAL) {
            return false;
        }
        *last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::map;

    fn map_with(keys: &[u64]) -> map::Repr {
        map::Repr {
            digest: [0; 32],
            extent_size: 1 << 20,
            entries: keys
                .iter()
                .enumerate()
                .map(|(i, &key)| map::MapEntry {
                    start: topology::PmemAddr((i as u64) << 30),
                    len: 1 << 20,
                    region: RegionIndex(i as u32),
                    server: 0,
                    socket: 0,
                    key: AccessKey(key),
                })
                .collect(),
        }
    }

    #[test]
    fn zero_means_the_regions_key_as_last_learnt() {
        let keys = RegionKeys::new(2);
        let none = AccessKey::NONE;
        assert_eq!(keys.resolve(RegionIndex(0), none), none, "not given yet");
        assert_eq!(keys.learn(&map_with(&[7, 0])), 1);
        assert_eq!(keys.resolve(RegionIndex(0), none), AccessKey(7));
        let own = AccessKey(99);
        assert_eq!(
            keys.resolve(RegionIndex(0), own),
            own,
            "an allocation's key"
        );
        assert_eq!(keys.learn(&map_with(&[7, 0])), 0, "nothing changed");
        assert_eq!(keys.learn(&map_with(&[8, 5])), 2, "rotated and new");
        assert_eq!(keys.get(RegionIndex(1)), AccessKey(5));
        assert_eq!(keys.get(RegionIndex(9)), none, "no such region");
    }

    #[test]
    fn refreshes_are_rate_limited_per_region() {
        let keys = RegionKeys::new(2);
        let t0 = Instant::now();
        assert!(keys.may_refresh(RegionIndex(0), t0));
        assert!(!keys.may_refresh(RegionIndex(0), t0 + Duration::from_millis(10)));
        assert!(
            keys.may_refresh(RegionIndex(1), t0),
            "each region on its own"
        );
        assert!(keys.may_refresh(RegionIndex(0), t0 + REFRESH_INTERVAL));
        assert!(!keys.may_refresh(RegionIndex(7), t0));
    }
}
