//! What a client may touch: its allow-list as PMEM address ranges, each
//! read-write or read-only.

use std::ops::Range;

use crate::addr::PmemAddr;
use crate::layout::Layout;
use crate::model::{Access, Client};

/// A client's grants: PMEM ranges `[start, end)` it may touch, and whether
/// it may change them; none listed means the whole pool, read-write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    ranges: Vec<(Range<PmemAddr>, Access)>,
}

impl Grants {
    /// `client`'s allow-list over `layout` (ranges naming a region the
    /// layout does not have are dropped; validation reports them).
    pub fn of(layout: &Layout, client: &Client) -> Self {
        let ranges = client
            .allow
            .iter()
            .filter_map(|range| {
                let entry = layout.entry_by_id(&range.region)?;
                let start = entry.start.checked_add(range.offset.bytes())?;
                let len = range
                    .size
                    .map_or(entry.len.saturating_sub(range.offset.bytes()), |s| {
                        s.bytes()
                    });
                let end = start.checked_add(len).unwrap_or(PmemAddr(u64::MAX));
                Some((start..end, range.access))
            })
            .collect();
        Grants { ranges }
    }

    /// Whether `[addr, addr + len)` lies inside one granted range that
    /// lets the client change memory when `write` says it would.
    pub fn allows(&self, addr: PmemAddr, len: u64, write: bool) -> bool {
        if self.ranges.is_empty() {
            return true;
        }
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.ranges.iter().any(|(range, access)| {
            addr >= range.start && end <= range.end && (!write || *access == Access::ReadWrite)
        })
    }

    /// Whether any granted range shares a byte with `[addr, addr + len)`
    /// (so the client needs the key of the region there).
    pub fn overlaps(&self, addr: PmemAddr, len: u64) -> bool {
        if self.ranges.is_empty() {
            return true;
        }
        let end = addr.checked_add(len).unwrap_or(PmemAddr(u64::MAX));
        self.ranges
            .iter()
            .any(|(range, _)| range.start < end && addr < range.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_any_shared_byte_and_no_list_is_everything() {
        let grants = Grants {
            ranges: vec![(PmemAddr(100)..PmemAddr(200), Access::Read)],
        };
        assert!(grants.overlaps(PmemAddr(0), 101));
        assert!(grants.overlaps(PmemAddr(199), 1));
        assert!(!grants.overlaps(PmemAddr(0), 100));
        assert!(!grants.overlaps(PmemAddr(200), 50));
        assert!(!grants.overlaps(PmemAddr(u64::MAX - 1), 10));
        assert!(Grants::default().overlaps(PmemAddr(0), 1));
    }
}
