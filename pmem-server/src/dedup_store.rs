//! The exactly-once window kept in a mapped file next to the region files,
//! so a restarted server still answers retried atomics from it instead of
//! applying them a second time.
//!
//! ```text
//! 0..4096          header: magic b"PMFABEO1", version u32 (2), ring u32, intents u32
//! 4096..8192       INTENTS intent records of 64 bytes (see below)
//! 8192..           slots of SLOT_BYTES each, as many as the file holds:
//!   0..4   client u32
//!   4..8   in use u32 (1)
//!   8..16  head u64: results recorded for the client so far
//!   64..   ring of RING entries (seq u64, value u64); entry i is at i % RING
//!   then   MARKS stale marks u64 (see `stale_marks`)
//! ```
//!
//! # Results
//!
//! A result is written before the head that covers it, and both before the
//! response goes out; the stale mark of a result it pushes out of the ring
//! is written before it overwrites that result, so after a crash the file never claims a result that
//! was not recorded. For a persistent atomic both are made durable before
//! the response; otherwise they live in the page cache (or the DAX media)
//! and survive a crash of the process, not of the machine.
//!
//! # Intents: applying and recording as one failure-atomic step
//!
//! A persistent exactly-once atomic changes two things that become durable
//! separately: its word in a region, and its result here. A power cut
//! between the two must not let a retry apply it again, and the changed
//! word may reach the media at any moment (caches evict lines when they
//! like). So before the word is changed, an *intent* is written: which
//! client and sequence number, which word, its value before and after
//! (made durable for a persistent atomic; for another it is in the page
//! cache, which covers a crash of the process). Intent records are per lock stripe of words (`dedup`), so one is written
//! while no other exactly-once atomic runs on its stripe. After a crash,
//! [`WindowStore::open`] returns the intents whose result is not recorded,
//! and recovery (`DedupTable::recover`) settles each before anything is
//! served, by looking at its word: still the old value, the atomic never
//! took effect and its retry applies it; anything else, it did, and its
//! result is recorded so the retry is answered from the window. Recovery
//! never writes a region. An intent carries a checksum: a torn one was
//! never followed by its store.
//!
//! # Size
//!
//! The file has a slot for every exactly-once identity the topology names
//! (client number and lane); [`WindowStore::open`] grows it when the
//! topology has more.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use topology::CachePolicy;

use crate::dedup::WINDOW;
use crate::persist::{PersistError, PersistPolicy, PmemMap};
use crate::stale_marks::{MARKS, RaisedMark, StaleMarks};

/// Results kept per client (the window).
pub const RING: usize = WINDOW;
/// Intent records: one per lock stripe of words.
pub const INTENTS: usize = 64;
const MAGIC: [u8; 8] = *b"PMFABEO1";
const VERSION: u32 = 2;
const HEADER: usize = 4096;
const INTENT_BYTES: usize = 64;
const INTENTS_AT: usize = HEADER;
const SLOTS_AT: usize = INTENTS_AT + (INTENTS * INTENT_BYTES).next_multiple_of(4096);
const SLOT_HEAD: usize = 64;
const MARKS_AT: usize = SLOT_HEAD + RING * 16;
const SLOT_BYTES: usize = (MARKS_AT + MARKS * 8).next_multiple_of(4096);

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
    /// The file is not one this server can read.
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
    /// Every slot is taken: the identity is not one the file was sized for.
    #[error("{path}: no slot left for exactly-once identity {client:#x}")]
    Full {
        /// The file.
        path: PathBuf,
        /// The identity without a slot.
        client: u32,
    },
}

/// One client's window as the file held it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedWindow {
    /// (seq, value) in the order they were recorded, oldest first.
    pub results: Vec<(u64, u64)>,
    /// Which sequence numbers left the window, per session.
    pub marks: StaleMarks,
    /// Results recorded so far (position of the next one).
    pub head: u64,
}

impl LoadedWindow {
    /// Whether the window knows what became of `seq`: recorded, or so old
    /// that it left the window.
    pub fn settled(&self, seq: u64) -> bool {
        self.marks.is_stale(seq) || self.results.iter().any(|&(s, _)| s == seq)
    }
}

/// An exactly-once atomic about to change its word: what recovery
/// needs to finish it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent {
    /// The exactly-once identity (lane and client number).
    pub client: u32,
    /// Its sequence number.
    pub seq: u64,
    /// The region index of the word.
    pub region: u32,
    /// The word's offset in the region.
    pub offset: u64,
    /// The word before the atomic: the atomic's result.
    pub old: u64,
    /// The word after it.
    pub new: u64,
}

impl Intent {
    fn encode(&self) -> [u8; INTENT_BYTES] {
        let mut out = [0u8; INTENT_BYTES];
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..12].copy_from_slice(&self.client.to_le_bytes());
        out[12..16].copy_from_slice(&self.region.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.old.to_le_bytes());
        out[32..40].copy_from_slice(&self.new.to_le_bytes());
        let check = checksum(&out[..40]);
        out[40..48].copy_from_slice(&check.to_le_bytes());
        out
    }

    /// The intent a record holds; `None` for an empty, cleared or torn one.
    fn decode(bytes: &[u8; INTENT_BYTES]) -> Option<Intent> {
        if u64_at(bytes, 40) != checksum(&bytes[..40]) {
            return None;
        }
        Some(Intent {
            seq: u64_at(bytes, 0),
            client: u32_at(bytes, 8),
            region: u32_at(bytes, 12),
            offset: u64_at(bytes, 16),
            old: u64_at(bytes, 24),
            new: u64_at(bytes, 32),
        })
    }
}

/// A 64-bit check over an intent's fields that is never that of an all-zero
/// (cleared) record; it catches torn records, not tampering.
fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(word);
        h = (h ^ (h >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h | 1
}

/// What the file held when it was opened.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Each identity's window.
    pub windows: HashMap<u32, LoadedWindow>,
    /// Persistent atomics a crash interrupted between their intent and
    /// their recorded result: recovery finishes them before serving.
    pub unfinished: Vec<Intent>,
}

/// The mapped window file.
#[derive(Debug)]
pub struct WindowStore {
    path: PathBuf,
    map: PmemMap,
    slot_count: usize,
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

/// The file length with `slots` slots.
fn file_len(slots: usize) -> u64 {
    (SLOTS_AT + slots * SLOT_BYTES) as u64
}

impl WindowStore {
    /// Opens (or creates) the window file in `dir` with room for at least
    /// `slots` identities, and returns what it holds. A new (empty) file,
    /// or `reset`, starts empty; a file with a bad header or geometry is
    /// [`StoreError::Damaged`]. A file with fewer slots is grown.
    pub fn open(
        dir: &Path,
        policy: &PersistPolicy,
        reset: bool,
        slots: usize,
    ) -> Result<(Self, Loaded), StoreError> {
        let path = dir.join(FILE_NAME);
        let create_err = |source| StoreError::Create {
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
        let len = file.metadata().map_err(create_err)?.len();
        let fresh = reset || len == 0;
        if fresh {
            file.set_len(0).map_err(create_err)?;
            let mut header = Vec::with_capacity(20);
            header.extend_from_slice(&MAGIC);
            header.extend_from_slice(&VERSION.to_le_bytes());
            header.extend_from_slice(&(RING as u32).to_le_bytes());
            header.extend_from_slice(&(INTENTS as u32).to_le_bytes());
            file.write_all_at(&header, 0).map_err(create_err)?;
        } else if let Some(why) = bad_geometry(&file, len) {
            return Err(StoreError::Damaged { path, why });
        }
        let held = if fresh {
            0
        } else {
            (len as usize - SLOTS_AT) / SLOT_BYTES
        };
        let slot_count = held.max(slots);
        if fresh || slot_count > held {
            file.set_len(file_len(slot_count)).map_err(create_err)?;
            file.sync_all().map_err(create_err)?;
        }
        drop(file);
        let map = PmemMap::open(&path, policy).map_err(|source| StoreError::Map {
            path: path.clone(),
            source,
        })?;
        let store = Self {
            path,
            map,
            slot_count,
            slots: Mutex::new((HashMap::new(), 0)),
        };
        let loaded = store.load()?;
        Ok((store, loaded))
    }

    /// Reads every slot in use and every intent whose result is missing.
    fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut slot_of = HashMap::new();
        let mut next_free = self.slot_count;
        let mut head_bytes = [0u8; SLOT_HEAD];
        for slot in 0..self.slot_count {
            let base = SLOTS_AT + slot * SLOT_BYTES;
            self.read(base, &mut head_bytes)?;
            if u32_at(&head_bytes, 4) != 1 {
                next_free = next_free.min(slot);
                continue;
            }
            let client = u32_at(&head_bytes, 0);
            let head = u64_at(&head_bytes, 8);
            let mut results = Vec::new();
            let mut entry = [0u8; 16];
            for i in head.saturating_sub(RING as u64)..head {
                self.read(Self::entry_at(base, i), &mut entry)?;
                results.push((u64_at(&entry, 0), u64_at(&entry, 8)));
            }
            let mut marks = [0u8; MARKS * 8];
            self.read(base + MARKS_AT, &mut marks)?;
            let marks = marks.chunks(8).map(|w| u64_at(w, 0)).collect();
            slot_of.insert(client, slot);
            loaded.windows.insert(
                client,
                LoadedWindow {
                    results,
                    marks: StaleMarks::from_words(marks),
                    head,
                },
            );
        }
        let mut record = [0u8; INTENT_BYTES];
        for stripe in 0..INTENTS {
            self.read(INTENTS_AT + stripe * INTENT_BYTES, &mut record)?;
            let Some(intent) = Intent::decode(&record) else {
                continue;
            };
            let settled = loaded
                .windows
                .get(&intent.client)
                .is_some_and(|w| w.settled(intent.seq));
            if !settled {
                loaded.unfinished.push(intent);
            }
        }
        *self.slots.lock().unwrap_or_else(PoisonError::into_inner) = (slot_of, next_free);
        Ok(loaded)
    }

    fn entry_at(slot_base: usize, index: u64) -> usize {
        slot_base + SLOT_HEAD + (index % RING as u64) as usize * 16
    }

    /// The slot of `client`, claiming a free one on first use;
    /// [`StoreError::Full`] when none is left.
    pub fn slot(&self, client: u32) -> Result<usize, StoreError> {
        let mut guard = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let (slot_of, next_free) = &mut *guard;
        if let Some(&slot) = slot_of.get(&client) {
            return Ok(slot);
        }
        if *next_free >= self.slot_count {
            return Err(StoreError::Full {
                path: self.path.clone(),
                client,
            });
        }
        let slot = *next_free;
        let base = SLOTS_AT + slot * SLOT_BYTES;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&client.to_le_bytes());
        head[4..].copy_from_slice(&1u32.to_le_bytes());
        self.write(base, &head)?;
        slot_of.insert(client, slot);
        // The next slot not in use.
        let mut probe = [0u8; 8];
        let mut next = slot + 1;
        while next < self.slot_count {
            self.read(SLOTS_AT + next * SLOT_BYTES, &mut probe)?;
            if u32_at(&probe, 4) != 1 {
                break;
            }
            next += 1;
        }
        *next_free = next;
        Ok(slot)
    }

    fn map_err(&self, source: PersistError) -> StoreError {
        StoreError::Map {
            path: self.path.clone(),
            source,
        }
    }

    fn read(&self, at: usize, out: &mut [u8]) -> Result<(), StoreError> {
        self.map
            .read(at, out)
            .map_err(|source| self.map_err(source))
    }

    fn write(&self, at: usize, bytes: &[u8]) -> Result<(), StoreError> {
        self.map
            .write(at, bytes, CachePolicy::WriteBack)
            .map_err(|source| self.map_err(source))
    }

    fn persist(&self, at: usize, len: usize) -> Result<(), StoreError> {
        self.map
            .persist(at, len)
            .map_err(|source| self.map_err(source))
    }

    /// Writes `intent` in the record of lock stripe `stripe`, durably when
    /// `durable`; the caller holds that stripe's lock and changes the word
    /// only after this returns.
    pub fn intend(&self, stripe: usize, intent: &Intent, durable: bool) -> Result<(), StoreError> {
        let at = INTENTS_AT + (stripe % INTENTS) * INTENT_BYTES;
        self.write(at, &intent.encode())?;
        if durable {
            self.persist(at, INTENT_BYTES)?;
        }
        Ok(())
    }

    /// Clears every intent record (after recovery finished them).
    pub fn clear_intents(&self) -> Result<(), StoreError> {
        let len = INTENTS * INTENT_BYTES;
        self.write(INTENTS_AT, &vec![0u8; len])?;
        self.persist(INTENTS_AT, len)
    }

    /// Records result `value` of (`client`, `seq`) as the client's result
    /// number `head`, with the stale mark the result it pushes out of the
    /// window raised; durably when `persist`. [`StoreError::Full`] when the
    /// file has no slot for the client.
    pub fn record(
        &self,
        client: u32,
        head: u64,
        (seq, value): (u64, u64),
        mark: Option<RaisedMark>,
        persist: bool,
    ) -> Result<(), StoreError> {
        let slot = self.slot(client)?;
        let base = SLOTS_AT + slot * SLOT_BYTES;
        if let Some(mark) = mark {
            let at = base + MARKS_AT + mark.index % MARKS * 8;
            self.write(at, &mark.word.to_le_bytes())?;
            if persist {
                self.persist(at, 8)?;
            }
        }
        let entry_at = Self::entry_at(base, head);
        let mut entry = [0u8; 16];
        entry[..8].copy_from_slice(&seq.to_le_bytes());
        entry[8..].copy_from_slice(&value.to_le_bytes());
        self.write(entry_at, &entry)?;
        // The slot's identity goes with its first result: a slot claimed
        // but not yet durable simply has no results after a crash.
        let mut slot_head = [0u8; 16];
        slot_head[..4].copy_from_slice(&client.to_le_bytes());
        slot_head[4..8].copy_from_slice(&1u32.to_le_bytes());
        slot_head[8..16].copy_from_slice(&(head + 1).to_le_bytes());
        if persist {
            self.persist(entry_at, 16)?;
        }
        // The head goes last: it is what makes the entry count.
        self.write(base, &slot_head)?;
        if persist {
            self.persist(base, 16)?;
        }
        Ok(())
    }
}

/// Why an existing file cannot be this server's window file, if it cannot.
fn bad_geometry(file: &std::fs::File, len: u64) -> Option<String> {
    let mut header = [0u8; 20];
    if file.read_exact_at(&mut header, 0).is_err() || header[..8] != MAGIC {
        return Some("bad magic".to_owned());
    }
    let version = u32_at(&header, 8);
    if version != VERSION {
        return Some(format!(
            "format version {version}, this server reads version {VERSION}"
        ));
    }
    if u32_at(&header, 12) as usize != RING || u32_at(&header, 16) as usize != INTENTS {
        return Some("another window geometry".to_owned());
    }
    let slots_len = len.checked_sub(SLOTS_AT as u64);
    if slots_len.is_none_or(|l| l % SLOT_BYTES as u64 != 0) {
        return Some(format!(
            "{len} bytes is not {SLOTS_AT} plus whole slots of {SLOT_BYTES}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path, reset: bool, slots: usize) -> (WindowStore, Loaded) {
        WindowStore::open(dir, &PersistPolicy::Msync, reset, slots).unwrap()
    }

    #[test]
    fn results_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, loaded) = open(dir.path(), false, 4);
            assert!(loaded.windows.is_empty());
            store.record(7, 0, (100, 5), None, false).unwrap();
            store.record(7, 1, (101, 6), None, true).unwrap();
            store.record(9, 0, (1, 42), None, false).unwrap();
        }
        let (_, loaded) = open(dir.path(), false, 4);
        assert_eq!(loaded.windows[&7].results, vec![(100, 5), (101, 6)]);
        assert_eq!(loaded.windows[&7].head, 2);
        assert_eq!(loaded.windows[&9].results, vec![(1, 42)]);
        let (_, formatted) = open(dir.path(), true, 4);
        assert!(formatted.windows.is_empty(), "--format starts empty");
    }

    #[test]
    fn the_ring_keeps_the_newest_results_and_the_marks() {
        let dir = tempfile::tempdir().unwrap();
        let mut marks = StaleMarks::default();
        {
            let (store, _) = open(dir.path(), false, 1);
            for i in 0..(RING as u64 + 10) {
                let mark = i
                    .checked_sub(RING as u64)
                    .and_then(|old| marks.raise(1000 + old));
                store.record(3, i, (1000 + i, i), mark, false).unwrap();
            }
        }
        let (_, loaded) = open(dir.path(), false, 1);
        let w = &loaded.windows[&3];
        assert_eq!(w.results.len(), RING);
        assert_eq!(w.results[0], (1010, 10));
        assert_eq!(
            w.results[RING - 1],
            (1000 + RING as u64 + 9, RING as u64 + 9)
        );
        assert_eq!(w.marks, marks);
        assert!(w.settled(1009) && w.settled(1010) && !w.settled(1000 + RING as u64 + 10));
    }

    #[test]
    fn a_full_file_refuses_new_identities_and_grows_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = open(dir.path(), false, 3);
            for client in 0..3 {
                store.record(client, 0, (1, 1), None, false).unwrap();
            }
            assert!(matches!(
                store.record(3, 0, (1, 1), None, false),
                Err(StoreError::Full { client: 3, .. })
            ));
            store.record(1, 1, (2, 2), None, false).unwrap();
        }
        // A topology with more identities: the file grows, keeping the rest.
        let (store, loaded) = open(dir.path(), false, 5);
        assert_eq!(loaded.windows.len(), 3);
        assert_eq!(loaded.windows[&1].results, vec![(1, 1), (2, 2)]);
        store.record(3, 0, (1, 1), None, false).unwrap();
        store.record(4, 0, (1, 1), None, false).unwrap();
        // A smaller topology does not shrink it.
        let (_, loaded) = open(dir.path(), false, 1);
        assert_eq!(loaded.windows.len(), 5);
    }

    #[test]
    fn intents_without_results_are_returned_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let finished = Intent {
            client: 2,
            seq: 10,
            region: 0,
            offset: 64,
            old: 1,
            new: 2,
        };
        let unfinished = Intent {
            seq: 11,
            offset: 128,
            ..finished
        };
        {
            let (store, _) = open(dir.path(), false, 2);
            store.intend(0, &finished, true).unwrap();
            store.record(2, 0, (10, 1), None, true).unwrap();
            store.intend(1, &unfinished, true).unwrap();
        }
        let (store, loaded) = open(dir.path(), false, 2);
        assert_eq!(loaded.unfinished, vec![unfinished]);
        store.clear_intents().unwrap();
        drop(store);
        let (_, loaded) = open(dir.path(), false, 2);
        assert!(loaded.unfinished.is_empty());
    }

    #[test]
    fn a_torn_intent_is_ignored() {
        let intent = Intent {
            client: 1,
            seq: 2,
            region: 3,
            offset: 4,
            old: 5,
            new: 6,
        };
        let whole = intent.encode();
        assert_eq!(Intent::decode(&whole), Some(intent));
        assert_eq!(Intent::decode(&[0; INTENT_BYTES]), None, "cleared");
        for word in 0..6 {
            let mut torn = whole;
            torn[word * 8..word * 8 + 8].fill(0);
            assert_eq!(Intent::decode(&torn), None, "word {word} lost");
        }
    }

    #[test]
    fn files_of_another_version_or_size_are_damaged_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), false, 1));
        let path = dir.path().join(FILE_NAME);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&1u32.to_le_bytes(), 8).unwrap();
        let err = WindowStore::open(dir.path(), &PersistPolicy::Msync, false, 1).unwrap_err();
        assert!(err.to_string().contains("format version 1"), "{err}");
        file.write_all_at(&VERSION.to_le_bytes(), 8).unwrap();
        file.set_len(file_len(1) + 100).unwrap();
        let err = WindowStore::open(dir.path(), &PersistPolicy::Msync, false, 1).unwrap_err();
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
    }
}
