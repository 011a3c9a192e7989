//! The epoch-dependent state of a pool as one snapshot, and the rules for
//! moving it to a newer epoch of the cluster map.
//!
//! Everything a request needs from the map (the layout, the translator,
//! the region keys and the path slots) lives in one [`Epoch`], swapped as
//! a whole: a request holds the snapshot it started with, so a map change
//! never tears it. The path table keeps its own lock (its health changes
//! with every answer) and is moved to the new map in the same step.
//!
//! A new epoch may append regions and withdraw regions, never move or
//! resize one ([`check_growth`]): an address in flight stays valid across
//! epochs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use topology::{Layout, RegionId};

use crate::translate::{StaticTranslator, Translator};

use super::keys::RegionKeys;
use super::{Backing, Slot};

/// The pool's view of one epoch of the map.
#[derive(Debug)]
pub(super) struct Epoch {
    /// The map's epoch (0: the pool reads a file and follows no map).
    pub number: u64,
    pub layout: Arc<Layout>,
    /// What translates virtual addresses when the TLB misses.
    pub translator: Backing,
    /// The static virtual space, kept stable across epochs.
    pub static_space: Arc<StaticTranslator>,
    /// The region keys the devices gave, by this layout's region index.
    pub region_keys: RegionKeys,
    /// Each path's connection, by path id (shared with later epochs).
    pub slots: Vec<Arc<Mutex<Slot>>>,
}

impl Epoch {
    /// The first epoch of a pool: `layout` as loaded, with the caller's
    /// translator when given, else the allocator's page table when the
    /// pool has one, else the static space.
    pub fn first(
        number: u64,
        layout: Layout,
        custom: Option<&Arc<dyn Translator>>,
        paths: usize,
    ) -> Self {
        let static_space = Arc::new(StaticTranslator::new(&layout));
        let translator = backing(&layout, custom, &static_space);
        Self {
            number,
            region_keys: RegionKeys::new(layout.entries().len()),
            layout: Arc::new(layout),
            translator,
            static_space,
            slots: (0..paths).map(|_| Arc::default()).collect(),
        }
    }

    /// The epoch after this one: `layout` (already checked with
    /// [`check_growth`]), keys carried over by region, `paths` slots (the
    /// existing ones shared, new ones empty).
    pub fn next(
        &self,
        number: u64,
        layout: Layout,
        custom: Option<&Arc<dyn Translator>>,
        paths: usize,
    ) -> Self {
        let static_space = Arc::new(self.static_space.follow(&layout));
        let translator = backing(&layout, custom, &static_space);
        let mut slots = self.slots.clone();
        slots.resize_with(paths.max(slots.len()), Arc::default);
        Self {
            number,
            region_keys: self.region_keys.carried(&self.layout, &layout),
            layout: Arc::new(layout),
            translator,
            static_space,
            slots,
        }
    }
}

fn backing(
    layout: &Layout,
    custom: Option<&Arc<dyn Translator>>,
    static_space: &Arc<StaticTranslator>,
) -> Backing {
    match (custom, layout.meta()) {
        (Some(custom), _) => Backing::Fixed(Arc::clone(custom)),
        (None, Some(meta)) => Backing::PageTable(meta.clone()),
        (None, None) => Backing::Fixed(Arc::clone(static_space) as Arc<dyn Translator>),
    }
}

/// Why a client refuses a new map and stays on its epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrowthError {
    /// A region both maps have sits elsewhere or has another size.
    #[error(
        "region {region} moves from PMEM {old_start:#x}+{old_len:#x} to {new_start:#x}+{new_len:#x}; \
         a new epoch may append and withdraw regions but never move or resize one"
    )]
    Moved {
        /// The region.
        region: RegionId,
        /// Where it was.
        old_start: u64,
        /// How long it was.
        old_len: u64,
        /// Where the new map puts it.
        new_start: u64,
        /// How long the new map makes it.
        new_len: u64,
    },
    /// The extent size changed.
    #[error("the extent size changes from {old} to {new} bytes; translations would no longer hold")]
    ExtentSize {
        /// The old one.
        old: u64,
        /// The new one.
        new: u64,
    },
    /// A new region overlaps the range of a region of the old map.
    #[error(
        "new region {region} at PMEM {start:#x}+{len:#x} overlaps region {over} of the running \
         map; a new region must take addresses no region of the running map uses"
    )]
    Overlaps {
        /// The new region.
        region: RegionId,
        /// Its start.
        start: u64,
        /// Its length.
        len: u64,
        /// The region it overlaps.
        over: RegionId,
    },
}

/// Whether `new` may follow `old`: every region of `old` that `new` keeps
/// has the same PMEM range, the extent size is the same, and a region new
/// to `new` overlaps no region of `old`.
pub fn check_growth(old: &Layout, new: &Layout) -> Result<(), GrowthError> {
    if old.extent_size() != new.extent_size() {
        return Err(GrowthError::ExtentSize {
            old: old.extent_size(),
            new: new.extent_size(),
        });
    }
    let before: HashMap<&RegionId, (u64, u64)> = old
        .entries()
        .iter()
        .map(|e| (&e.region_id, (e.start.get(), e.len)))
        .collect();
    for entry in new.entries() {
        let (start, len) = (entry.start.get(), entry.len);
        match before.get(&entry.region_id) {
            Some(&(old_start, old_len)) if (old_start, old_len) != (start, len) => {
                return Err(GrowthError::Moved {
                    region: entry.region_id.clone(),
                    old_start,
                    old_len,
                    new_start: start,
                    new_len: len,
                });
            }
            Some(_) => {}
            None => {
                let over = old
                    .entries()
                    .iter()
                    .find(|o| o.start.get() < start + len && start < o.end());
                if let Some(over) = over {
                    return Err(GrowthError::Overlaps {
                        region: entry.region_id.clone(),
                        start,
                        len,
                        over: over.region_id.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// For each server index of `old`, its index in `new` (servers are found
/// by id; `None` when `new` has no region of it).
pub fn server_moves(old: &Layout, new: &Layout) -> impl Fn(u16) -> Option<u16> + use<> {
    let new_index: HashMap<_, _> = new
        .entries()
        .iter()
        .map(|e| (e.server.clone(), e.server_index))
        .collect();
    let moves: HashMap<u16, u16> = old
        .entries()
        .iter()
        .filter_map(|e| Some((e.server_index, *new_index.get(&e.server)?)))
        .collect();
    move |server| moves.get(&server).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::{EnvOverrides, Topology};

    const DEFAULT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/default.toml");

    fn text() -> String {
        std::fs::read_to_string(DEFAULT).unwrap()
    }

    fn layout_of(text: &str) -> Layout {
        let topology = Topology::from_toml_str("test", text, &EnvOverrides::None).unwrap();
        topology.validate().unwrap();
        Layout::new(&topology).unwrap()
    }

    const SERVER_C: &str = r#"
[[servers]]
id = "C"
  [[servers.sockets]]
  id = "0"
    [[servers.sockets.devices]]
    id = "pmem0"
      [[servers.sockets.devices.regions]]
      id = "PC.1"
      size = "64MiB"
  [[servers.nics]]
  id = "n0"
  socket = "0"
  listen = "127.0.1.5:7000"
"#;

    fn with_c() -> String {
        control::edit::add_server(&text(), SERVER_C)
            .unwrap()
            .topology
    }

    #[test]
    fn appending_a_server_is_growth_and_keeps_every_address() {
        let old = layout_of(&text());
        let new = layout_of(&with_c());
        assert_eq!(check_growth(&old, &new), Ok(()));
        assert_eq!(new.entries().len(), old.entries().len() + 1);
        let moves = server_moves(&old, &new);
        for e in old.entries() {
            assert_eq!(moves(e.server_index), Some(e.server_index));
        }
    }

    #[test]
    fn withdrawing_a_server_is_allowed_and_its_index_is_gone() {
        let old = layout_of(&with_c());
        let edited = control::edit::remove_server(&with_c(), "A", true).unwrap();
        let new = layout_of(&edited.topology);
        // Removing the first server moves later regions unless they keep
        // their address; the check says which way it went.
        match check_growth(&old, &new) {
            Ok(()) => {
                let a = old.entries().iter().find(|e| e.server.as_str() == "A");
                let moves = server_moves(&old, &new);
                assert_eq!(moves(a.unwrap().server_index), None);
            }
            Err(GrowthError::Moved { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn a_map_that_moves_or_resizes_a_region_is_refused_naming_it() {
        let old = layout_of(&text());
        let first = old.entries()[0].region_id.to_string();
        let resized = text().replacen("size = \"64MiB\"", "size = \"128MiB\"", 1);
        let err = check_growth(&old, &layout_of(&resized)).unwrap_err();
        assert!(matches!(err, GrowthError::Moved { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains(&first) && message.contains("never move or resize"),
            "{message}"
        );
        let other_extent = text().replace("extent_size = \"2MiB\"", "extent_size = \"1MiB\"");
        assert!(matches!(
            check_growth(&old, &layout_of(&other_extent)),
            Err(GrowthError::ExtentSize { .. })
        ));
    }

    #[test]
    fn keys_follow_their_region_and_the_static_space_keeps_its_addresses() {
        let old = layout_of(&text());
        let new = layout_of(&with_c());
        let keys = RegionKeys::new(old.entries().len());
        let mut map = old.to_map();
        for (i, e) in map.entries.iter_mut().enumerate() {
            e.key = topology::AccessKey(100 + i as u64);
        }
        keys.learn(&map);
        let epoch = Epoch::first(1, old.clone(), None, 2);
        epoch.region_keys.learn(&map);
        let next = epoch.next(2, new.clone(), None, 3);
        assert_eq!(next.slots.len(), 3);
        assert!(Arc::ptr_eq(&next.slots[0], &epoch.slots[0]));
        for e in old.entries() {
            let moved = new.entry_by_id(&e.region_id).unwrap();
            assert_eq!(
                next.region_keys.get(moved.region),
                keys.get(e.region),
                "{}",
                e.region_id
            );
        }
        let added = new.entries().last().unwrap();
        assert!(next.region_keys.get(added.region).is_none());
        let before: Vec<_> = epoch.static_space.region_ranges().collect();
        let after: Vec<_> = next.static_space.region_ranges().collect();
        assert_eq!(&after[..before.len()], &before[..]);
        assert_eq!(after.last().unwrap().1, epoch.static_space.end());
    }
}
