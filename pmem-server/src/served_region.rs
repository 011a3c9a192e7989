//! A region as the server serves it: its layout entry, its mapped file and
//! the key requests must carry; the executor, the tenancy checks, the server
//! and the verbs registration share it.

use std::sync::atomic::{AtomicU64, Ordering};

use proto::{AccessKey, Status};
use topology::LayoutEntry;

use crate::held::CopyRole;
use crate::region_file::{HEADER_LEN, RegionFile};

/// A region this server exports: its place in the layout, its mapped file
/// and its key.
#[derive(Debug)]
pub struct ServedRegion {
    /// The region's layout entry (index, size, cache policy).
    pub entry: LayoutEntry,
    /// The mapped file holding it.
    pub file: RegionFile,
    /// Which copy of the region this server holds.
    pub role: CopyRole,
    /// The region key requests must carry: the file's, until rotated.
    key: AtomicU64,
}

impl ServedRegion {
    /// Serves `file` as the region of `entry`, with the key its header holds.
    pub fn new(entry: LayoutEntry, file: RegionFile) -> Self {
        let key = AtomicU64::new(file.header.key.get());
        Self {
            entry,
            file,
            role: CopyRole::Primary,
            key,
        }
    }

    /// This region as the `role` copy.
    pub fn with_role(self, role: CopyRole) -> Self {
        Self { role, ..self }
    }

    /// The region key requests must carry now.
    pub fn key(&self) -> AccessKey {
        AccessKey(self.key.load(Ordering::Acquire))
    }

    /// Makes `key` the one requests must carry (after the file's key was
    /// rotated).
    pub(crate) fn set_key(&self, key: AccessKey) {
        self.key.store(key.get(), Ordering::Release);
    }

    /// The mapping offset of `len` bytes at region offset `offset`, or
    /// OUT_OF_BOUNDS when the range leaves the region.
    pub(crate) fn span(&self, offset: u64, len: u64) -> Result<usize, Status> {
        let end = offset.checked_add(len).ok_or(Status::OutOfBounds)?;
        if end > self.file.data_len() {
            return Err(Status::OutOfBounds);
        }
        usize::try_from(HEADER_LEN + offset).map_err(|_| Status::OutOfBounds)
    }
}
