//! Checksums of a region's blocks at rest, so that bytes that change
//! without a write (a flipped bit in the media, a stray write to the file)
//! are noticed.
//!
//! The region is cut into blocks of [`BLOCK_LEN`] bytes. A scrub walks a
//! run of blocks: a block with no checksum yet, or written since its
//! checksum was recorded, has its checksum recorded; any other block is
//! verified against its checksum, and a block that no longer matches is a
//! mismatch. Its checksum is kept, so every later scrub reports it again
//! until a write replaces the block.
//!
//! Writes are told apart from damage by a bit per block that every write
//! executed here sets, once before it changes the bytes and once after
//! ([`BlockSums::writing`]): a verification that reads a block while a
//! write changes it finds the bit set and records the block instead of
//! reporting it, and a recording that races a write leaves the bit set, so
//! the next scrub records the block again.
//!
//! The table lives in the server's memory and is made by the first scrub
//! (8 bytes and 1 bit per block). A clean stop saves it and the next start
//! loads it ([`crate::sums_file`]), so damage done while the server was
//! down is noticed; after a crash the first scrub records every block
//! again. Writes that do not go
//! through this server's CPU (RDMA on a verbs NIC) cannot set the bits; a
//! region reachable that way is [unwatched](BlockSums::set_unwatched) and
//! its blocks are counted as such, never verified.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Mutex, OnceLock, PoisonError};

use proto::block_report::Head;
use proto::block_sums::Report as CurrentSums;
use proto::scrub::Report;

use crate::persist::{PersistError, PmemMap};
use crate::region_format::HEADER_LEN;

/// Bytes per checksummed block.
pub const BLOCK_LEN: u64 = 64 << 10;

/// The block checksums of one region and the marks of blocks written since.
#[derive(Debug)]
pub struct BlockSums {
    data_len: u64,
    table: OnceLock<Table>,
    unwatched: AtomicBool,
}

#[derive(Debug)]
struct Table {
    /// One bit per block: written since its checksum was recorded.
    written: Box<[AtomicU64]>,
    /// One checksum per block; 0 when none is recorded. Held while a scrub
    /// runs, so scrubs of one region take turns.
    sums: Mutex<Box<[u64]>>,
}

/// Why a scrub did not run.
#[derive(Debug, thiserror::Error)]
pub enum ScrubFault {
    /// The blocks asked for are not all in the region.
    #[error("blocks {first}..{end} are outside the region's {total} blocks")]
    OutOfRange {
        /// The first block asked for.
        first: u64,
        /// One past the last.
        end: u64,
        /// Blocks in the region.
        total: u64,
    },
    /// A block could not be read.
    #[error("cannot read block {block}")]
    Read {
        /// The block.
        block: u64,
        /// Why.
        #[source]
        source: PersistError,
    },
}

/// A write in progress over some blocks: they were marked written when it
/// was made and are marked again when it is dropped, after the write.
#[derive(Debug)]
pub struct Writing<'a> {
    table: Option<&'a Table>,
    sums: &'a BlockSums,
    first: u64,
    last: u64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        // The table may have been made while the write ran.
        if let Some(table) = self.table.or_else(|| self.sums.table.get()) {
            fence(Ordering::SeqCst);
            table.mark(self.first, self.last);
        }
    }
}

impl Table {
    fn new(blocks: u64) -> Self {
        let words = blocks.div_ceil(64) as usize;
        Self {
            written: (0..words).map(|_| AtomicU64::new(0)).collect(),
            sums: Mutex::new(vec![0; blocks as usize].into_boxed_slice()),
        }
    }

    /// Marks blocks `first..=last` written. A bit already set is left
    /// alone, so writes to marked blocks only read the shared word (loads
    /// and clears are sequentially consistent: a bit seen set here was not
    /// cleared before).
    fn mark(&self, first: u64, last: u64) {
        for block in first..=last {
            let (word, bit) = bit_of(block);
            let Some(word) = self.written.get(word) else {
                return;
            };
            if word.load(Ordering::SeqCst) & bit == 0 {
                word.fetch_or(bit, Ordering::SeqCst);
            }
        }
    }

    fn is_written(&self, block: u64) -> bool {
        let (word, bit) = bit_of(block);
        self.written
            .get(word)
            .is_some_and(|w| w.load(Ordering::SeqCst) & bit != 0)
    }

    fn clear_written(&self, block: u64) {
        let (word, bit) = bit_of(block);
        if let Some(word) = self.written.get(word) {
            word.fetch_and(!bit, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }
}

fn bit_of(block: u64) -> (usize, u64) {
    ((block / 64) as usize, 1 << (block % 64))
}

/// The checksum of a block's bytes; never 0, which means "none recorded".
/// The head of a report on blocks `first..` of region `region`, of
/// `total` blocks of [`BLOCK_LEN`] bytes.
fn report_head(region: u32, first: u64, total: u64) -> Head {
    Head {
        region,
        block_len: BLOCK_LEN as u32,
        first,
        total,
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    u64::from(crc32fast::hash(bytes)) | 1 << 32
}

impl BlockSums {
    /// No checksums yet for a region of `data_len` bytes.
    pub fn new(data_len: u64) -> Self {
        Self {
            data_len,
            table: OnceLock::new(),
            unwatched: AtomicBool::new(false),
        }
    }

    /// The checksums `sums` (one per block, 0 for none) saved by an
    /// earlier server for a region of `data_len` bytes; `None` when they do
    /// not fit it.
    pub fn with_sums(data_len: u64, sums: Vec<u64>) -> Option<Self> {
        let loaded = Self::new(data_len);
        if sums.len() as u64 != loaded.blocks() {
            return None;
        }
        let table = Table {
            written: (0..sums.len().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            sums: Mutex::new(sums.into_boxed_slice()),
        };
        let _ = loaded.table.set(table);
        Some(loaded)
    }

    /// The recorded checksums, one per block, with 0 for blocks that have
    /// none or were written since theirs was recorded; `None` before the
    /// first scrub. For saving at a clean stop, when nothing writes.
    pub fn saved_sums(&self) -> Option<Vec<u64>> {
        let table = self.table.get()?;
        let sums = table.sums.lock().unwrap_or_else(PoisonError::into_inner);
        Some(
            sums.iter()
                .enumerate()
                .map(|(block, &sum)| {
                    if table.is_written(block as u64) {
                        0
                    } else {
                        sum
                    }
                })
                .collect(),
        )
    }

    /// Blocks in the region (the last may be short).
    pub fn blocks(&self) -> u64 {
        self.data_len.div_ceil(BLOCK_LEN)
    }

    /// Says the region is written where the server does not see it (RDMA):
    /// its blocks are never verified.
    pub fn set_unwatched(&self) {
        self.unwatched.store(true, Ordering::Relaxed);
    }

    /// Whether the region is written where the server does not see it.
    pub fn is_unwatched(&self) -> bool {
        self.unwatched.load(Ordering::Relaxed)
    }

    /// Marks the blocks of `len` bytes at region offset `offset` written,
    /// now and again when the returned guard is dropped: hold it while the
    /// bytes change.
    pub fn writing(&self, offset: u64, len: u64) -> Writing<'_> {
        let first = offset / BLOCK_LEN;
        let last = offset.saturating_add(len.max(1) - 1) / BLOCK_LEN;
        let table = self.table.get();
        if let Some(table) = table {
            table.mark(first, last);
            fence(Ordering::SeqCst);
        }
        Writing {
            table,
            sums: self,
            first,
            last,
        }
    }

    /// The checksums of `blocks` blocks from block `first` of the region
    /// mapped by `map` (data after the header) as their bytes are now,
    /// reported as region `region`. Nothing is recorded: two copies of a
    /// region compare these to find the blocks that differ, whether or not
    /// the server sees the writes.
    pub fn current(
        &self,
        map: &PmemMap,
        region: u32,
        first: u64,
        blocks: u32,
    ) -> Result<CurrentSums, ScrubFault> {
        let total = self.blocks();
        let end = first.saturating_add(u64::from(blocks));
        if end > total {
            return Err(ScrubFault::OutOfRange { first, end, total });
        }
        let mut buf = vec![0u8; BLOCK_LEN as usize];
        let mut sums = Vec::with_capacity(blocks as usize);
        for block in first..end {
            let start = block * BLOCK_LEN;
            let bytes = &mut buf[..(self.data_len - start).min(BLOCK_LEN) as usize];
            map.read((HEADER_LEN + start) as usize, bytes)
                .map_err(|source| ScrubFault::Read { block, source })?;
            sums.push(checksum(bytes));
        }
        Ok(CurrentSums {
            head: report_head(region, first, total),
            sums,
        })
    }

    /// Scrubs `blocks` blocks from block `first` of the region mapped by
    /// `map` (data after the header), and reports them as region `region`.
    pub fn scrub(
        &self,
        map: &PmemMap,
        region: u32,
        first: u64,
        blocks: u32,
    ) -> Result<Report, ScrubFault> {
        let total = self.blocks();
        let end = first.saturating_add(u64::from(blocks));
        if end > total {
            return Err(ScrubFault::OutOfRange { first, end, total });
        }
        let mut report = Report {
            head: report_head(region, first, total),
            ..Report::default()
        };
        if self.is_unwatched() {
            report.unwatched = blocks;
            return Ok(report);
        }
        let table = self.table.get_or_init(|| Table::new(total));
        let mut sums = table.sums.lock().unwrap_or_else(PoisonError::into_inner);
        let mut buf = vec![0u8; BLOCK_LEN as usize];
        for block in first..end {
            let start = block * BLOCK_LEN;
            let bytes = &mut buf[..(self.data_len - start).min(BLOCK_LEN) as usize];
            let read = |bytes: &mut [u8]| {
                map.read((HEADER_LEN + start) as usize, bytes)
                    .map(|()| checksum(bytes))
                    .map_err(|source| ScrubFault::Read { block, source })
            };
            let recorded = sums[block as usize];
            if recorded == 0 || table.is_written(block) {
                table.clear_written(block);
                sums[block as usize] = read(bytes)?;
                report.recorded += 1;
                continue;
            }
            if read(bytes)? == recorded {
                report.verified += 1;
                continue;
            }
            fence(Ordering::SeqCst);
            if table.is_written(block) {
                // A write changed it while it was read.
                table.clear_written(block);
                sums[block as usize] = read(bytes)?;
                report.recorded += 1;
            } else {
                report.mismatches.push(block);
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::PersistPolicy;

    /// A mapped file with a header page and `data_len` bytes of data.
    fn region(data_len: u64) -> (tempfile::TempDir, PmemMap, BlockSums) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.pmem");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(HEADER_LEN + data_len).unwrap();
        let map = PmemMap::open(&path, &PersistPolicy::Msync).unwrap();
        (dir, map, BlockSums::new(data_len))
    }

    /// Stores `bytes` at region offset `offset` as a write executed by the
    /// server does: marked before and after.
    fn write(map: &PmemMap, sums: &BlockSums, offset: u64, bytes: &[u8]) {
        let _writing = sums.writing(offset, bytes.len() as u64);
        poke(map, offset, bytes);
    }

    /// Stores `bytes` behind the server's back.
    fn poke(map: &PmemMap, offset: u64, bytes: &[u8]) {
        map.write(
            (HEADER_LEN + offset) as usize,
            bytes,
            topology::CachePolicy::WriteBack,
        )
        .unwrap();
    }

    fn scrub_all(map: &PmemMap, sums: &BlockSums) -> Report {
        let blocks = sums.blocks() as u32;
        sums.scrub(map, 7, 0, blocks).unwrap()
    }

    #[test]
    fn the_first_scrub_records_and_the_next_verifies() {
        let (_dir, map, sums) = region(4 * BLOCK_LEN + 100);
        assert_eq!(sums.blocks(), 5, "the short last block counts");
        let first = scrub_all(&map, &sums);
        assert_eq!((first.head.region, first.head.total), (7, 5));
        assert_eq!((first.recorded, first.verified), (5, 0));
        let second = scrub_all(&map, &sums);
        assert_eq!((second.recorded, second.verified), (0, 5));
        assert!(second.mismatches.is_empty());
    }

    #[test]
    fn a_byte_changed_without_a_write_is_reported_until_a_write_replaces_it() {
        let (_dir, map, sums) = region(4 * BLOCK_LEN + 100);
        scrub_all(&map, &sums);
        poke(&map, 2 * BLOCK_LEN + 9, &[0xFF]);
        poke(&map, 4 * BLOCK_LEN + 99, &[0x01]);
        assert_eq!(scrub_all(&map, &sums).mismatches, [2, 4]);
        assert_eq!(scrub_all(&map, &sums).mismatches, [2, 4], "reported again");
        write(&map, &sums, 2 * BLOCK_LEN, &[0u8; 16]);
        let after = scrub_all(&map, &sums);
        assert_eq!(after.mismatches, [4]);
        assert_eq!(after.recorded, 1);
    }

    #[test]
    fn written_blocks_are_recorded_not_reported() {
        let (_dir, map, sums) = region(4 * BLOCK_LEN);
        scrub_all(&map, &sums);
        // A write across the boundary of blocks 0 and 1.
        write(&map, &sums, BLOCK_LEN - 4, &[7u8; 8]);
        let report = scrub_all(&map, &sums);
        assert!(report.mismatches.is_empty());
        assert_eq!((report.recorded, report.verified), (2, 2));
    }

    #[test]
    fn a_write_that_straddles_a_recording_is_recorded_again() {
        let (_dir, map, sums) = region(2 * BLOCK_LEN);
        scrub_all(&map, &sums);
        // The write is marked, the scrub records the old bytes, then the
        // bytes change and the write ends.
        let writing = sums.writing(10, 4);
        assert_eq!(scrub_all(&map, &sums).recorded, 1);
        poke(&map, 10, b"new!");
        drop(writing);
        let report = scrub_all(&map, &sums);
        assert!(report.mismatches.is_empty(), "{report:?}");
        assert_eq!(report.recorded, 1);
        assert_eq!(scrub_all(&map, &sums).verified, 2);
    }

    #[test]
    fn a_write_begun_before_the_first_scrub_is_seen_when_it_ends() {
        let (_dir, map, sums) = region(BLOCK_LEN);
        let writing = sums.writing(0, 8);
        scrub_all(&map, &sums);
        poke(&map, 0, b"late....");
        drop(writing);
        assert!(scrub_all(&map, &sums).mismatches.is_empty());
    }

    #[test]
    fn current_sums_follow_the_bytes_and_record_nothing() {
        let (_dir, map, sums) = region(3 * BLOCK_LEN + 10);
        let before = sums.current(&map, 4, 0, 4).unwrap();
        let head = before.head;
        assert_eq!((head.region, head.first, head.total), (4, 0, 4));
        assert_eq!(head.block_len as u64, BLOCK_LEN);
        assert_eq!(before.sums.len(), 4);
        assert!(before.sums.iter().all(|&s| s != 0));
        // Zeroed blocks of one length share a checksum; the short last
        // block has its own.
        assert_eq!(before.sums[0], before.sums[2]);
        assert_ne!(before.sums[0], before.sums[3]);
        // A change behind the server's back shows at once, in its block only.
        poke(&map, BLOCK_LEN + 1, &[9]);
        let after = sums.current(&map, 4, 1, 2).unwrap();
        assert_eq!(after.head.first, 1);
        assert_ne!(after.sums[0], before.sums[1]);
        assert_eq!(after.sums[1], before.sums[2]);
        // Nothing was recorded: the first scrub still records every block.
        assert_eq!(scrub_all(&map, &sums).recorded, 4);
        // An unwatched region is summed all the same.
        sums.set_unwatched();
        assert_eq!(sums.current(&map, 4, 1, 1).unwrap().sums, [after.sums[0]]);
        assert!(matches!(
            sums.current(&map, 4, 3, 2),
            Err(ScrubFault::OutOfRange {
                first: 3,
                end: 5,
                total: 4
            })
        ));
    }

    #[test]
    fn unwatched_regions_and_blocks_outside_are_not_checked() {
        let (_dir, map, sums) = region(2 * BLOCK_LEN);
        assert!(matches!(
            sums.scrub(&map, 0, 1, 2),
            Err(ScrubFault::OutOfRange {
                first: 1,
                end: 3,
                total: 2
            })
        ));
        sums.set_unwatched();
        let report = scrub_all(&map, &sums);
        assert_eq!(
            (report.unwatched, report.recorded, report.verified),
            (2, 0, 0)
        );
    }
}
