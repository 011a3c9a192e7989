//! Mapping a file with `MAP_SHARED_VALIDATE | MAP_SYNC` (mmap(2)): on a DAX
//! filesystem the CPU then stores straight into persistent memory, and the
//! kernel guarantees the file's metadata is durable whenever a page is
//! writable, so cache-line write-back is all a store needs to become durable.
//!
//! Without DAX the kernel refuses with `EOPNOTSUPP` (`EINVAL` on kernels that
//! predate `MAP_SHARED_VALIDATE`).

use std::fs::File;
use std::io;
use std::ptr::NonNull;

/// An mmap(2) mapping owned by this value and unmapped on drop.
#[derive(Debug)]
pub(crate) struct RawMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is process-wide memory, not tied to the creating
// thread; RawMapping only holds its address and unmaps it once, on drop.
unsafe impl Send for RawMapping {}
// SAFETY: RawMapping offers no access to the bytes itself (PmemMap does, under
// its own contract); sharing its address between threads is harmless.
unsafe impl Sync for RawMapping {}

impl RawMapping {
    /// Maps `len` bytes of `file` from offset 0, read-write and shared, with
    /// `MAP_SYNC`.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    pub(crate) fn map_sync(file: &File, len: usize) -> io::Result<RawMapping> {
        RawMapping::map(file, len, libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC)
    }

    /// DAX needs Linux's `MAP_SYNC` and an x86_64 cache-line write-back.
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    pub(crate) fn map_sync(_file: &File, _len: usize) -> io::Result<RawMapping> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "DAX mappings need Linux MAP_SYNC on x86_64",
        ))
    }

    /// Maps like [`map_sync`](Self::map_sync) but with plain `MAP_SHARED`, so
    /// that tests can drive the DAX code paths on a machine without DAX (the
    /// result is not durable by cache-line write-back).
    #[cfg(test)]
    pub(crate) fn map_shared_for_test(file: &File, len: usize) -> io::Result<RawMapping> {
        RawMapping::map(file, len, libc::MAP_SHARED)
    }

    /// Maps `len` bytes of a device DAX character device from `offset`,
    /// read-write and shared. Device DAX is always synchronous, so no
    /// `MAP_SYNC` is asked for; `offset` and `len` must be multiples of the
    /// device's alignment (the kernel refuses others with `EINVAL`).
    #[cfg(target_os = "linux")]
    pub(crate) fn map_device(file: &File, offset: u64, len: usize) -> io::Result<RawMapping> {
        let offset = libc::off_t::try_from(offset).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "offset beyond the largest file offset",
            )
        })?;
        RawMapping::map_at(file, offset, len, libc::MAP_SHARED)
    }

    /// Device DAX exists only on Linux.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn map_device(_file: &File, _offset: u64, _len: usize) -> io::Result<RawMapping> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "device DAX needs Linux",
        ))
    }

    #[cfg(any(test, all(target_os = "linux", target_arch = "x86_64")))]
    fn map(file: &File, len: usize, flags: libc::c_int) -> io::Result<RawMapping> {
        RawMapping::map_at(file, 0, len, flags)
    }

    #[cfg(any(test, target_os = "linux"))]
    fn map_at(
        file: &File,
        offset: libc::off_t,
        len: usize,
        flags: libc::c_int,
    ) -> io::Result<RawMapping> {
        use std::os::fd::AsRawFd;

        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map zero bytes",
            ));
        }
        // SAFETY: a fresh mapping (address chosen by the kernel, so nothing
        // existing is replaced) of `len` bytes at `offset` of an open file
        // descriptor that stays valid for the call; the result is checked
        // below.
        let addr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast::<u8>())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "mmap returned address 0"))?;
        Ok(RawMapping { base, len })
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for RawMapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe a mapping this value created and
        // still owns; PmemMap, the only user of the address, is being dropped
        // with it, so no access follows. A failure cannot be acted upon.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Whether a `map_sync` error means "no DAX here" (fall back) rather than a
/// real failure.
pub(crate) fn is_dax_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
    ) || error.kind() == io::ErrorKind::Unsupported
}
