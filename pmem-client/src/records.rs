//! The allocator's records in PMEM: their encodings are
//! [`topology::records`] (shared with the servers that check them); this
//! module adds where a record's virtual extent is.

pub use topology::records::*;
use topology::{MetaLayout, VirtAddr};

use crate::translate::VIRT_BASE;

/// The page-table index of `vaddr`'s virtual extent, if the table maps it.
pub fn vextent_of(meta: &MetaLayout, vaddr: VirtAddr) -> Option<u64> {
    let index = vaddr.get().checked_sub(VIRT_BASE)? / meta.extent_size();
    (index < meta.page_table_entries()).then_some(index)
}

/// The first virtual address of page-table entry `index`'s extent.
pub fn vbase_of(meta: &MetaLayout, index: u64) -> VirtAddr {
    VirtAddr(VIRT_BASE + index * meta.extent_size())
}
