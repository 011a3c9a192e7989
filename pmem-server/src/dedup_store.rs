//! The exactly-once window kept in a mapped file next to the region files,
//! so a restarted server still answers retried atomics from it instead of
//! applying them a second time.
//!
//! ```text
//! 0..4096          header: magic b"PMFABEO1", version u32, slots u32, ring u32
//! then SLOTS slots of SLOT_BYTES each:
//!   0..4   client u32
//!   4..8   in use u32 (1)
//!   8..16  head u64: results recorded for the client so far
//!   16..24 evicted u64: 1 + the highest sequence number that left the ring (0: none)
//!   64..   ring of RING entries (seq u64, value u64); entry i is at i % RING
//! ```
//!
//! A result is written before the head that covers it, and both before the
//! response goes out, so after a crash the file never claims a result that
//! was not recorded. The file is as durable as the atomics themselves: the
//! record of a PERSIST atomic is made durable with it; otherwise it lives in
//! the page cache (or on the DAX media) and survives a crash of the process.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use topology::{CachePolicy, Persistence};

use crate::dedup::WINDOW;
use crate::persist::{PersistError, PmemMap};

/// Clients whose windows the file holds; further clients are remembered in
/// memory only.
pub const SLOTS: usize = 256;
/// Results kept per client (the window).
pub const RING: usize = WINDOW;
const MAGIC: [u8; 8] = *b"PMFABEO1";
const VERSION: u32 = 1;
const HEADER: usize = 4096;
const SLOT_HEAD: usize = 64;
const SLOT_BYTES: usize = (SLOT_HEAD + RING * 16).div_ceil(4096) * 4096;
const FILE_LEN: usize = HEADER + SLOTS * SLOT_BYTES;

/// The file name in the data directory.
pub const FILE_NAME: &str = "exactly-once.pmem";

/// Why the window file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Creating or sizing the file failed.
    #[error("{path}: cannot create the exactly-once window file")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Mapping or accessing it failed.
    #[error(
        "{path}: the exactly-once window file is damaged ({why}); resetting it could apply \
         retried atomics twice. Restore it, or start with --reset-exactly-once to begin an \
         empty window"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Mapping or accessing it failed.
    #[error("{path}: cannot use the exactly-once window file")]
    Map {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: PersistError,
    },
}

/// One client's window as the file held it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedWindow {
    /// (seq, value) in the order they were recorded, oldest first.
    pub results: Vec<(u64, u64)>,
    /// The highest sequence number that left the window.
    pub evicted_up_to: Option<u64>,
    /// Results recorded so far (position of the next one).
    pub head: u64,
}

/// The mapped window file.
#[derive(Debug)]
pub struct WindowStore {
    path: PathBuf,
    map: PmemMap,
    /// Slot of each client that has one, and the next free slot.
    slots: Mutex<(HashMap<u32, usize>, usize)>,
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(v)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

impl WindowStore {
    /// Opens (or creates) the window file in `dir` and returns what it holds
    /// per client. A new (empty) file, or `reset`, starts empty; a file of
    /// the wrong size or with a bad header is [`StoreError::Damaged`].
    pub fn open(
        dir: &Path,
        persistence: Persistence,
        reset: bool,
    ) -> Result<(Self, HashMap<u32, LoadedWindow>), StoreError> {
        let path = dir.join(FILE_NAME);
        let create_err = |source| StoreError::Create {
            path: path.clone(),
            source,
        };
        let map_err = |source| StoreError::Map {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(create_err)?;
        let mut header = [0u8; 20];
        let len = file.metadata().map_err(create_err)?.len();
        let fresh = reset || len == 0;
        if !fresh {
            use std::os::unix::fs::FileExt;
            let why = if len != FILE_LEN as u64 {
                Some(format!("{len} bytes, expected {FILE_LEN}"))
            } else if file.read_exact_at(&mut header, 0).is_err() || header[..8] != MAGIC {
                Some("bad magic".to_owned())
            } else if u32_at(&header, 8) != VERSION
                || u32_at(&header, 12) as usize != SLOTS
                || u32_at(&header, 16) as usize != RING
            {
                Some("another format version or geometry".to_owned())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(StoreError::Damaged { path, why });
            }
        }
        if fresh {
            file.set_len(0).map_err(create_err)?;
            file.set_len(FILE_LEN as u64).map_err(create_err)?;
            let mut h = Vec::with_capacity(20);
            h.extend_from_slice(&MAGIC);
            h.extend_from_slice(&VERSION.to_le_bytes());
            h.extend_from_slice(&(SLOTS as u32).to_le_bytes());
            h.extend_from_slice(&(RING as u32).to_le_bytes());
            use std::os::unix::fs::FileExt;
            file.write_all_at(&h, 0).map_err(create_err)?;
            file.sync_all().map_err(create_err)?;
        }
        drop(file);
        let map = PmemMap::open(&path, persistence).map_err(map_err)?;
        let mut windows = HashMap::new();
        let mut slot_of = HashMap::new();
        let mut next_free = SLOTS;
        let mut head_bytes = [0u8; SLOT_HEAD];
        for slot in 0..SLOTS {
            let base = HEADER + slot * SLOT_BYTES;
            map.read(base, &mut head_bytes).map_err(map_err)?;
            if u32_at(&head_bytes, 4) != 1 {
                next_free = next_free.min(slot);
                continue;
            }
            let client = u32_at(&head_bytes, 0);
            let head = u64_at(&head_bytes, 8);
            let evicted = u64_at(&head_bytes, 16);
            let mut results = Vec::new();
            let mut entry = [0u8; 16];
            for i in head.saturating_sub(RING as u64)..head {
                let at = base + SLOT_HEAD + (i % RING as u64) as usize * 16;
                map.read(at, &mut entry).map_err(map_err)?;
                results.push((u64_at(&entry, 0), u64_at(&entry, 8)));
            }
            slot_of.insert(client, slot);
            windows.insert(
                client,
                LoadedWindow {
                    results,
                    evicted_up_to: evicted.checked_sub(1),
                    head,
                },
            );
        }
        let store = Self {
            path,
            map,
            slots: Mutex::new((slot_of, next_free)),
        };
        Ok((store, windows))
    }

    /// The slot of `client`, claiming a free one on first use; `None` when
    /// the file is full.
    fn slot(&self, client: u32) -> Result<Option<usize>, StoreError> {
        let mut guard = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let (slot_of, next_free) = &mut *guard;
        if let Some(&slot) = slot_of.get(&client) {
            return Ok(Some(slot));
        }
        if *next_free >= SLOTS {
            return Ok(None);
        }
        let slot = *next_free;
        let base = HEADER + slot * SLOT_BYTES;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&client.to_le_bytes());
        head[4..].copy_from_slice(&1u32.to_le_bytes());
        self.write(base, &head)?;
        slot_of.insert(client, slot);
        // The next slot not in use.
        let mut probe = [0u8; 8];
        let mut next = slot + 1;
        while next < SLOTS {
            self.map
                .read(HEADER + next * SLOT_BYTES, &mut probe)
                .map_err(|source| self.map_err(source))?;
            if u32_at(&probe, 4) != 1 {
                break;
            }
            next += 1;
        }
        *next_free = next;
        Ok(Some(slot))
    }

    fn map_err(&self, source: PersistError) -> StoreError {
        StoreError::Map {
            path: self.path.clone(),
            source,
        }
    }

    fn write(&self, at: usize, bytes: &[u8]) -> Result<(), StoreError> {
        self.map
            .write(at, bytes, CachePolicy::WriteBack)
            .map_err(|source| self.map_err(source))
    }

    /// Records result `value` of (`client`, `seq`) as the client's result
    /// number `head`, with the client's eviction mark; durably when
    /// `persist`. Returns false when the file has no slot for the client.
    pub fn record(
        &self,
        client: u32,
        head: u64,
        seq: u64,
        value: u64,
        evicted_up_to: Option<u64>,
        persist: bool,
    ) -> Result<bool, StoreError> {
        let Some(slot) = self.slot(client)? else {
            return Ok(false);
        };
        let base = HEADER + slot * SLOT_BYTES;
        let entry_at = base + SLOT_HEAD + (head % RING as u64) as usize * 16;
        let mut entry = [0u8; 16];
        entry[..8].copy_from_slice(&seq.to_le_bytes());
        entry[8..].copy_from_slice(&value.to_le_bytes());
        self.write(entry_at, &entry)?;
        let mut marks = [0u8; 16];
        marks[..8].copy_from_slice(&(head + 1).to_le_bytes());
        marks[8..].copy_from_slice(&evicted_up_to.map_or(0, |e| e + 1).to_le_bytes());
        if persist {
            self.map
                .persist(entry_at, 16)
                .map_err(|source| self.map_err(source))?;
        }
        // The head goes last: it is what makes the entry count.
        self.write(base + 8, &marks)?;
        if persist {
            self.map
                .persist(base + 8, 16)
                .map_err(|source| self.map_err(source))?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, loaded) = WindowStore::open(dir.path(), Persistence::Msync, false).unwrap();
            assert!(loaded.is_empty());
            assert!(store.record(7, 0, 100, 5, None, false).unwrap());
            assert!(store.record(7, 1, 101, 6, None, true).unwrap());
            assert!(store.record(9, 0, 1, 42, None, false).unwrap());
        }
        let (_, loaded) = WindowStore::open(dir.path(), Persistence::Msync, false).unwrap();
        assert_eq!(loaded[&7].results, vec![(100, 5), (101, 6)]);
        assert_eq!(loaded[&7].head, 2);
        assert_eq!(loaded[&9].results, vec![(1, 42)]);
        let (_, formatted) = WindowStore::open(dir.path(), Persistence::Msync, true).unwrap();
        assert!(formatted.is_empty(), "--format starts empty");
    }

    #[test]
    fn the_ring_keeps_the_newest_results() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = WindowStore::open(dir.path(), Persistence::Msync, false).unwrap();
            for i in 0..(RING as u64 + 10) {
                let evicted = i.checked_sub(RING as u64);
                store.record(3, i, 1000 + i, i, evicted, false).unwrap();
            }
        }
        let (_, loaded) = WindowStore::open(dir.path(), Persistence::Msync, false).unwrap();
        let w = &loaded[&3];
        assert_eq!(w.results.len(), RING);
        assert_eq!(w.results[0], (1010, 10));
        assert_eq!(
            w.results[RING - 1],
            (1000 + RING as u64 + 9, RING as u64 + 9)
        );
        assert_eq!(w.evicted_up_to, Some(9));
    }

    #[test]
    fn more_clients_than_slots_are_refused_not_corrupted() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = WindowStore::open(dir.path(), Persistence::Msync, false).unwrap();
        for client in 0..SLOTS as u32 {
            assert!(store.record(client, 0, 1, 1, None, false).unwrap());
        }
        assert!(!store.record(SLOTS as u32, 0, 1, 1, None, false).unwrap());
        assert!(
            store.record(5, 1, 2, 2, None, false).unwrap(),
            "known clients still fit"
        );
    }
}
