//! The exactly-once window kept in a mapped file next to the region files,
//! so a restarted server still answers retried atomics from it instead of
//! applying them a second time.
//!
//! ```text
//! 0..4096          header: magic b"PMFABEO1", version u32 (3), ring u32, intents u32
//! 4096..8192       INTENTS intent records of 64 bytes (see below)
//! 8192..           slots of SLOT_BYTES each, as many as the file holds:
//!   0..4   client u32
//!   4..8   in use u32 (1; 0 for a free slot, whose other bytes mean nothing)
//!   8..16  head word: results recorded so far (bits 0..48) and a 16-bit
//!          check of (client, head) (bits 48..64); 0 is head 0
//!   64..   ring of RING entries of 32 bytes: seq u64, value u64, request
//!          digest u64, check u64 of (client, entry number, seq, value,
//!          digest); entry number i is at i % RING
//!   then   MARKS stale marks of 16 bytes: word u64 (see `marks`), check
//!          u64 of (client, mark index, word); a free mark is all zeroes
//! ```
//!
//! # Results
//!
//! A result is written before the head that covers it, and both before the
//! response goes out; the stale mark of a result it pushes out of the ring
//! is written before it overwrites that result, so after a crash the file
//! never claims a result that was not recorded. For a persistent atomic
//! both are made durable before the response; otherwise they live in the
//! page cache (or the DAX media) and survive a crash of the process, not of
//! the machine.
//!
//! # Damage
//!
//! Everything the file claims carries a check, and [`WindowStore::open`]
//! verifies every slot in use before the server answers anything: a head,
//! result or mark that fails its check (a result a power cut kept from the
//! media is blank or still the one it replaced, and is taken as lost, as a
//! non-persistent atomic's result may be), an in-use word that is neither 0
//! nor 1, an identity in two slots, or a file that is missing or empty
//! although the data
//! directory held this server's regions before, is
//! [`StoreError::Damaged`]. Trusting such a window could apply a retried
//! atomic twice or answer it with another request's result, so the server
//! stops and the operator decides (`--reset-exactly-once`). The head is one
//! 8-byte word with its check inside, so a power cut cannot tear it; a
//! result is written whole before the head covers it, so only an uncovered
//! entry can be torn. A mark and its check share one 16-byte-aligned unit
//! of a cache line: media that tore even that would show a torn mark as
//! damage after a power cut, which errs on the side of refusing to start.
//!
//! # Intents: applying and recording as one failure-atomic step
//!
//! A persistent exactly-once atomic changes two things that become durable
//! separately: its word in a region, and its result here. A power cut
//! between the two must not let a retry apply it again, and the changed
//! word may reach the media at any moment (caches evict lines when they
//! like). So before the word is changed, an *intent* is written: which
//! client and sequence number, which word, its value before and after, and
//! the request's digest (made durable for a persistent atomic; for another
//! it is in the page cache, which covers a crash of the process). Intent
//! records are per lock stripe of words (`dedup`), so one is written while
//! no other exactly-once atomic runs on its stripe. After a crash,
//! [`WindowStore::open`] returns the intents whose result is not recorded,
//! and recovery settles each before anything is served, by looking at its
//! word: still the old value, the atomic never took effect and its retry
//! applies it; anything else, it did, and its result is recorded so the
//! retry is answered from the window. Recovery never writes a region. An
//! intent carries a checksum: a torn one was never followed by its store.
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

use super::marks::{MARKS, RaisedMark, StaleMarks};
use super::record::{Recorded, RequestDigest, WINDOW, checksum, checksum_words};
use crate::persist::{PersistError, PersistPolicy, PmemMap};

/// Results kept per client (the window).
pub const RING: usize = WINDOW;
/// Intent records: one per lock stripe of words.
pub const INTENTS: usize = 64;
const MAGIC: [u8; 8] = *b"PMFABEO1";
const VERSION: u32 = 3;
const HEADER: usize = 4096;
const INTENT_BYTES: usize = 64;
const INTENTS_AT: usize = HEADER;
const SLOTS_AT: usize = INTENTS_AT + (INTENTS * INTENT_BYTES).next_multiple_of(4096);
const SLOT_HEAD: usize = 64;
const ENTRY_BYTES: usize = 32;
const MARK_BYTES: usize = 16;
const MARKS_AT: usize = SLOT_HEAD + RING * ENTRY_BYTES;
const SLOT_BYTES: usize = (MARKS_AT + MARKS * MARK_BYTES).next_multiple_of(4096);
/// The bits of a head word that count results; the rest is its check.
const HEAD_BITS: u32 = 48;
const HEAD_MASK: u64 = (1 << HEAD_BITS) - 1;

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
    /// The file is not one this server can trust.
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
    /// (seq, result) in the order they were recorded, oldest first.
    pub results: Vec<(u64, Recorded)>,
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
    /// The request that changes it.
    pub digest: RequestDigest,
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
        out[40..48].copy_from_slice(&self.digest.0.to_le_bytes());
        let check = checksum(&out[..48]);
        out[48..56].copy_from_slice(&check.to_le_bytes());
        out
    }

    /// The intent a record holds; `None` for an empty, cleared or torn one.
    fn decode(bytes: &[u8; INTENT_BYTES]) -> Option<Intent> {
        if u64_at(bytes, 48) != checksum(&bytes[..48]) {
            return None;
        }
        Some(Intent {
            seq: u64_at(bytes, 0),
            client: u32_at(bytes, 8),
            region: u32_at(bytes, 12),
            offset: u64_at(bytes, 16),
            old: u64_at(bytes, 24),
            new: u64_at(bytes, 32),
            digest: RequestDigest(u64_at(bytes, 40)),
        })
    }
}

/// The head word of `client`'s slot with `head` results recorded.
fn head_word(client: u32, head: u64) -> u64 {
    let check = checksum_words(&[u64::from(client), head]) >> HEAD_BITS;
    (head & HEAD_MASK) | check << HEAD_BITS
}

/// The 32 bytes of `client`'s result number `index`.
fn encode_entry(client: u32, index: u64, seq: u64, result: Recorded) -> [u8; ENTRY_BYTES] {
    let words = [seq, result.value, result.digest.0];
    let check = checksum_words(&[u64::from(client), index, seq, result.value, result.digest.0]);
    let mut out = [0u8; ENTRY_BYTES];
    for (i, w) in words.iter().chain([&check]).enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The result an entry holds, if it passes its check as `client`'s result
/// number `index`.
fn decode_entry(client: u32, index: u64, bytes: &[u8; ENTRY_BYTES]) -> Option<(u64, Recorded)> {
    let (seq, value, digest) = (u64_at(bytes, 0), u64_at(bytes, 8), u64_at(bytes, 16));
    let check = checksum_words(&[u64::from(client), index, seq, value, digest]);
    (u64_at(bytes, 24) == check).then_some((
        seq,
        Recorded {
            value,
            digest: RequestDigest(digest),
        },
    ))
}

/// The 16 bytes of mark `index` of `client` holding `word`.
fn encode_mark(client: u32, index: usize, word: u64) -> [u8; MARK_BYTES] {
    let mut out = [0u8; MARK_BYTES];
    out[..8].copy_from_slice(&word.to_le_bytes());
    let check = checksum_words(&[u64::from(client), index as u64, word]);
    out[8..].copy_from_slice(&check.to_le_bytes());
    out
}

/// The word mark `index` of `client` holds (0: free), if it passes its check.
fn decode_mark(client: u32, index: usize, bytes: &[u8]) -> Option<u64> {
    let (word, check) = (u64_at(bytes, 0), u64_at(bytes, 8));
    if word == 0 && check == 0 {
        return Some(0);
    }
    (check == checksum_words(&[u64::from(client), index as u64, word])).then_some(word)
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

/// What the caller knows of the window before opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Start an empty window whatever the file holds (`--format`,
    /// `--reset-exactly-once`).
    Reset,
    /// The data directory held this server's regions before this start, so
    /// it held a window too: a missing or empty file is damage.
    Existing,
    /// The regions are new (or there are none): a missing or empty file
    /// starts an empty window.
    New,
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
    /// `slots` identities, and returns what it holds. A new (empty) file
    /// starts empty unless `expect` says the window existed, and
    /// [`Expect::Reset`] starts empty whatever the file holds; a file with
    /// a bad header or geometry, or whose slots fail their checks, is
    /// [`StoreError::Damaged`]. A file with fewer slots is grown.
    pub fn open(
        dir: &Path,
        policy: &PersistPolicy,
        expect: Expect,
        slots: usize,
    ) -> Result<(Self, Loaded), StoreError> {
        let path = dir.join(FILE_NAME);
        let create_err = |source| StoreError::Create {
            path: path.clone(),
            source,
        };
        let existed = match std::fs::metadata(&path) {
            Ok(meta) => Some(meta.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(create_err(source)),
        };
        if expect == Expect::Existing {
            let why = match existed {
                None => Some("it is missing"),
                Some(0) => Some("it is empty"),
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(StoreError::Damaged {
                    path,
                    why: format!(
                        "{why}, but the data directory holds this server's regions from an \
                         earlier start, which kept their window there"
                    ),
                });
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(create_err)?;
        let len = file.metadata().map_err(create_err)?.len();
        let fresh = expect == Expect::Reset || len == 0;
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

    fn damaged(&self, why: String) -> StoreError {
        StoreError::Damaged {
            path: self.path.clone(),
            why,
        }
    }

    /// Reads and checks every slot, and returns every intent whose result
    /// is missing.
    fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut slot_of = HashMap::new();
        let mut next_free = self.slot_count;
        let mut slot_bytes = vec![0u8; SLOT_BYTES];
        let mut head = [0u8; 8];
        for slot in 0..self.slot_count {
            // A free slot is judged by its first 8 bytes, so the room kept
            // for identities not used yet costs one page each to check.
            self.read(SLOTS_AT + slot * SLOT_BYTES, &mut head)?;
            if u32_at(&head, 4) == 0 {
                next_free = next_free.min(slot);
                continue;
            }
            self.read(SLOTS_AT + slot * SLOT_BYTES, &mut slot_bytes)?;
            let Some((client, window)) = self.check_slot(slot, &slot_bytes)? else {
                next_free = next_free.min(slot);
                continue;
            };
            if let Some(other) = slot_of.insert(client, slot) {
                return Err(self.damaged(format!(
                    "slots {other} and {slot} both hold identity {client:#x}"
                )));
            }
            loaded.windows.insert(client, window);
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

    /// The identity and window slot number `slot` holds (`None`: free),
    /// or why it cannot be trusted.
    fn check_slot(
        &self,
        slot: usize,
        bytes: &[u8],
    ) -> Result<Option<(u32, LoadedWindow)>, StoreError> {
        // A free slot's bytes mean nothing (a claim a crash lost may have
        // left a result there), and nothing is read from it.
        let in_use = u32_at(bytes, 4);
        if in_use == 0 {
            return Ok(None);
        }
        let client = u32_at(bytes, 0);
        let bad =
            |what: String| self.damaged(format!("slot {slot} (identity {client:#x}): {what}"));
        if in_use != 1 {
            return Err(bad(format!("its in-use word is {in_use:#x}")));
        }
        let word = u64_at(bytes, 8);
        let head = word & HEAD_MASK;
        if word != 0 && word != head_word(client, head) {
            return Err(bad(format!("its head word {word:#x} fails its check")));
        }
        let mut results = Vec::new();
        for index in head.saturating_sub(RING as u64)..head {
            let at = SLOT_HEAD + (index % RING as u64) as usize * ENTRY_BYTES;
            let entry: &[u8; ENTRY_BYTES] = bytes[at..at + ENTRY_BYTES]
                .try_into()
                .map_err(|_| bad("short entry".to_owned()))?;
            if let Some(result) = decode_entry(client, index, entry) {
                results.push(result);
                continue;
            }
            // The result of an atomic that was not persistent may not have
            // reached the media before a power cut while the head did (a
            // later persistent result, or the cache, wrote it back): then
            // the entry is still blank, or still the one it replaced. That
            // result is lost, as a non-persistent atomic may be. Anything
            // else is damage.
            let blank = entry.iter().all(|&b| b == 0);
            let replaced = index
                .checked_sub(RING as u64)
                .is_some_and(|older| decode_entry(client, older, entry).is_some());
            if !(blank || replaced) {
                return Err(bad(format!("result {index} fails its check")));
            }
        }
        let mut words = Vec::with_capacity(MARKS);
        for index in 0..MARKS {
            let at = MARKS_AT + index * MARK_BYTES;
            let word = decode_mark(client, index, &bytes[at..at + MARK_BYTES])
                .ok_or_else(|| bad(format!("stale mark {index} fails its check")))?;
            words.push(word);
        }
        Ok(Some((
            client,
            LoadedWindow {
                results,
                marks: StaleMarks::from_words(words),
                head,
            },
        )))
    }

    fn entry_at(slot_base: usize, index: u64) -> usize {
        slot_base + SLOT_HEAD + (index % RING as u64) as usize * ENTRY_BYTES
    }

    /// How many identities the file has slots for.
    pub fn capacity(&self) -> usize {
        self.slot_count
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

    /// Records `result` of (`client`, `seq`) as the client's result number
    /// `head`, with the stale mark the result it pushes out of the window
    /// raised; durably when `persist`. [`StoreError::Full`] when the file
    /// has no slot for the client.
    pub fn record(
        &self,
        client: u32,
        head: u64,
        (seq, result): (u64, Recorded),
        mark: Option<RaisedMark>,
        persist: bool,
    ) -> Result<(), StoreError> {
        let slot = self.slot(client)?;
        let base = SLOTS_AT + slot * SLOT_BYTES;
        if let Some(mark) = mark {
            let index = mark.index % MARKS;
            let at = base + MARKS_AT + index * MARK_BYTES;
            self.write(at, &encode_mark(client, index, mark.word))?;
            if persist {
                self.persist(at, MARK_BYTES)?;
            }
        }
        let mut slot_head = [0u8; 16];
        slot_head[..4].copy_from_slice(&client.to_le_bytes());
        slot_head[4..8].copy_from_slice(&1u32.to_le_bytes());
        if persist && head == 0 {
            // The slot's claim is durable before its first result, so a
            // power cut never leaves a head in a slot that reads as free.
            self.write(base, &slot_head[..8])?;
            self.persist(base, 8)?;
        }
        let entry_at = Self::entry_at(base, head);
        self.write(entry_at, &encode_entry(client, head, seq, result))?;
        if persist {
            self.persist(entry_at, ENTRY_BYTES)?;
        }
        // The head goes last, its count and check in one word: it is what
        // makes the entry count.
        slot_head[8..].copy_from_slice(&head_word(client, head + 1).to_le_bytes());
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
        let expect = if reset { Expect::Reset } else { Expect::New };
        WindowStore::open(dir, &PersistPolicy::Msync, expect, slots).unwrap()
    }

    /// A result of `value` for a request whose digest is derived from it.
    fn r(value: u64) -> Recorded {
        Recorded {
            value,
            digest: RequestDigest(value ^ 0x5eed),
        }
    }

    #[test]
    fn results_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, loaded) = open(dir.path(), false, 4);
            assert!(loaded.windows.is_empty());
            store.record(7, 0, (100, r(5)), None, false).unwrap();
            store.record(7, 1, (101, r(6)), None, true).unwrap();
            store.record(9, 0, (1, r(42)), None, false).unwrap();
        }
        let (_, loaded) = open(dir.path(), false, 4);
        assert_eq!(loaded.windows[&7].results, vec![(100, r(5)), (101, r(6))]);
        assert_eq!(loaded.windows[&7].head, 2);
        assert_eq!(loaded.windows[&9].results, vec![(1, r(42))]);
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
                store.record(3, i, (1000 + i, r(i)), mark, false).unwrap();
            }
        }
        let (_, loaded) = open(dir.path(), false, 1);
        let w = &loaded.windows[&3];
        assert_eq!(w.results.len(), RING);
        assert_eq!(w.results[0], (1010, r(10)));
        assert_eq!(
            w.results[RING - 1],
            (1000 + RING as u64 + 9, r(RING as u64 + 9))
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
                store.record(client, 0, (1, r(1)), None, false).unwrap();
            }
            assert!(matches!(
                store.record(3, 0, (1, r(1)), None, false),
                Err(StoreError::Full { client: 3, .. })
            ));
            store.record(1, 1, (2, r(2)), None, false).unwrap();
        }
        // A topology with more identities: the file grows, keeping the rest.
        let (store, loaded) = open(dir.path(), false, 5);
        assert_eq!(loaded.windows.len(), 3);
        assert_eq!(loaded.windows[&1].results, vec![(1, r(1)), (2, r(2))]);
        store.record(3, 0, (1, r(1)), None, false).unwrap();
        store.record(4, 0, (1, r(1)), None, false).unwrap();
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
            digest: RequestDigest(77),
        };
        let unfinished = Intent {
            seq: 11,
            offset: 128,
            ..finished
        };
        {
            let (store, _) = open(dir.path(), false, 2);
            store.intend(0, &finished, true).unwrap();
            store.record(2, 0, (10, r(1)), None, true).unwrap();
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
            digest: RequestDigest(7),
        };
        let whole = intent.encode();
        assert_eq!(Intent::decode(&whole), Some(intent));
        assert_eq!(Intent::decode(&[0; INTENT_BYTES]), None, "cleared");
        for word in 0..7 {
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
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.write_all_at(&1u32.to_le_bytes(), 8).unwrap();
        let err = WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 1).unwrap_err();
        assert!(err.to_string().contains("format version 1"), "{err}");
        file.write_all_at(&VERSION.to_le_bytes(), 8).unwrap();
        file.set_len(file_len(1) + 100).unwrap();
        let err = WindowStore::open(dir.path(), &PersistPolicy::Msync, Expect::New, 1).unwrap_err();
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
    }

    /// A window of two identities with a few results each, written and
    /// closed; returns the file's path.
    fn written(dir: &Path) -> PathBuf {
        let (store, _) = open(dir, false, 4);
        for i in 0..5 {
            store.record(1, i, (10 + i, r(i)), None, true).unwrap();
        }
        let mut marks = StaleMarks::default();
        let mark = marks.raise(3);
        store.record(2, 0, (4, r(9)), mark, true).unwrap();
        dir.join(FILE_NAME)
    }

    fn reopen(dir: &Path, expect: Expect) -> Result<Loaded, StoreError> {
        WindowStore::open(dir, &PersistPolicy::Msync, expect, 4).map(|(_, loaded)| loaded)
    }

    #[test]
    fn an_intact_window_passes_its_checks() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path());
        let loaded = reopen(dir.path(), Expect::Existing).unwrap();
        assert_eq!(loaded.windows[&1].results.len(), 5);
        assert!(loaded.windows[&2].marks.is_stale(3));
    }

    #[test]
    fn a_missing_or_emptied_window_of_existing_regions_is_damage() {
        for emptied in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = written(dir.path());
            if emptied {
                std::fs::File::create(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
            let err = reopen(dir.path(), Expect::Existing).unwrap_err();
            let why = if emptied {
                "it is empty"
            } else {
                "it is missing"
            };
            assert!(err.to_string().contains(why), "{err}");
            assert!(err.to_string().contains("--reset-exactly-once"), "{err}");
            // New regions, or the operator's reset, start an empty window.
            assert!(reopen(dir.path(), Expect::New).unwrap().windows.is_empty());
            assert!(reopen(dir.path(), Expect::Reset).is_ok());
        }
    }

    #[test]
    fn random_bytes_anywhere_in_a_used_slot_are_damage() {
        // Where in slot 0 (identity 1, five results) the bytes land: the
        // head word, a result, a mark.
        for at in [8, SLOT_HEAD + 2 * ENTRY_BYTES + 3, MARKS_AT] {
            let dir = tempfile::tempdir().unwrap();
            let path = written(dir.path());
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            file.write_all_at(&[0xa5, 0x5a, 0x3c, 0xc3, 0x99], (SLOTS_AT + at) as u64)
                .unwrap();
            let err = reopen(dir.path(), Expect::Existing).unwrap_err();
            assert!(matches!(err, StoreError::Damaged { .. }), "at {at}: {err}");
            assert!(err.to_string().contains("slot 0"), "at {at}: {err}");
        }
    }

    #[test]
    fn a_duplicated_identity_or_a_bad_in_use_word_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(dir.path());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // Slot 1 (identity 2) copied over slot 2.
        let mut slot = vec![0u8; SLOT_BYTES];
        file.read_exact_at(&mut slot, (SLOTS_AT + SLOT_BYTES) as u64)
            .unwrap();
        file.write_all_at(&slot, (SLOTS_AT + 2 * SLOT_BYTES) as u64)
            .unwrap();
        let err = reopen(dir.path(), Expect::Existing).unwrap_err();
        assert!(err.to_string().contains("both hold identity 0x2"), "{err}");
        file.write_all_at(&7u32.to_le_bytes(), (SLOTS_AT + 2 * SLOT_BYTES + 4) as u64)
            .unwrap();
        let err = reopen(dir.path(), Expect::Existing).unwrap_err();
        assert!(err.to_string().contains("in-use word is 0x7"), "{err}");
    }

    #[test]
    fn a_result_moved_to_another_identity_fails_its_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(dir.path());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // Identity 2's only result, copied over identity 1's first.
        let mut entry = [0u8; ENTRY_BYTES];
        file.read_exact_at(&mut entry, (SLOTS_AT + SLOT_BYTES + SLOT_HEAD) as u64)
            .unwrap();
        file.write_all_at(&entry, (SLOTS_AT + SLOT_HEAD) as u64)
            .unwrap();
        let err = reopen(dir.path(), Expect::Existing).unwrap_err();
        assert!(
            err.to_string().contains("result 0 fails its check"),
            "{err}"
        );
    }

    #[test]
    fn a_result_that_never_reached_the_media_is_lost_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(dir.path());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // Identity 1's result 3 is blank, as if its page never reached the
        // disk while the head did.
        let entry3 = (SLOTS_AT + SLOT_HEAD + 3 * ENTRY_BYTES) as u64;
        file.write_all_at(&[0; ENTRY_BYTES], entry3).unwrap();
        let loaded = reopen(dir.path(), Expect::Existing).unwrap();
        let seqs: Vec<u64> = loaded.windows[&1].results.iter().map(|r| r.0).collect();
        assert_eq!(seqs, [10, 11, 12, 14], "result 3 (seq 13) lost");
        // Still the result it replaced, one ring earlier: identity 7 (slot
        // 2) fills its ring, then its next result is lost in the same way.
        let (store, _) = open(dir.path(), false, 4);
        for i in 0..RING as u64 {
            store.record(7, i, (100 + i, r(i)), None, false).unwrap();
        }
        drop(store);
        let first = (SLOTS_AT + 2 * SLOT_BYTES + SLOT_HEAD) as u64;
        let mut replaced = [0u8; ENTRY_BYTES];
        file.read_exact_at(&mut replaced, first).unwrap();
        let (store, _) = open(dir.path(), false, 4);
        store
            .record(7, RING as u64, (9999, r(1)), None, false)
            .unwrap();
        drop(store);
        file.write_all_at(&replaced, first).unwrap();
        let loaded = reopen(dir.path(), Expect::Existing).unwrap();
        let seven = &loaded.windows[&7];
        assert_eq!(seven.head, RING as u64 + 1);
        assert_eq!(seven.results.len(), RING - 1, "result {RING} lost");
        assert!(!seven.results.iter().any(|r| r.0 == 9999));
        // Bytes that are no entry of any generation are still damage.
        file.write_all_at(&[7; ENTRY_BYTES], entry3).unwrap();
        let err = reopen(dir.path(), Expect::Existing).unwrap_err();
        assert!(
            err.to_string().contains("result 3 fails its check"),
            "{err}"
        );
    }
}
