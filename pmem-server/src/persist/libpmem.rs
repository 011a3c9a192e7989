//! Mapping and persisting through the system libpmem (feature `libpmem`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use libpmem_sys as sys;

use super::PersistError;

/// A mapping made by `pmem_map_file`, released with `pmem_unmap` on drop.
#[derive(Debug)]
pub(crate) struct LibpmemMapping {
    base: NonNull<u8>,
    len: usize,
    /// `pmem_is_pmem` over the whole mapping, asked once after mapping.
    is_pmem: bool,
}

// SAFETY: the mapping is process-wide memory, not tied to the creating
// thread; this value only holds its address and unmaps it once, on drop.
unsafe impl Send for LibpmemMapping {}
// SAFETY: the methods taking `&self` are libpmem calls documented as safe for
// concurrent use on any mapped range; byte access is PmemMap's business.
unsafe impl Sync for LibpmemMapping {}

impl LibpmemMapping {
    /// Maps the whole of the existing file `path` (no creation flags).
    pub(crate) fn map(path: &Path) -> Result<LibpmemMapping, PersistError> {
        let c_path =
            CString::new(path.as_os_str().as_bytes()).map_err(|_| PersistError::Libpmem {
                path: path.to_owned(),
                message: "path contains a NUL byte".to_owned(),
            })?;
        let mut mapped_len: sys::size_t = 0;
        // SAFETY: `c_path` is NUL-terminated and outlives the call;
        // `mapped_len` is a live local; is_pmem is not requested (asked below
        // with pmem_is_pmem, which honours PMEM_IS_PMEM_FORCE).
        let addr = unsafe {
            sys::pmem_map_file(
                c_path.as_ptr(),
                0,
                0,
                0,
                &mut mapped_len,
                core::ptr::null_mut(),
            )
        };
        let Some(base) = NonNull::new(addr.cast::<u8>()) else {
            return Err(PersistError::Libpmem {
                path: path.to_owned(),
                message: last_error(),
            });
        };
        let mut mapping = LibpmemMapping {
            base,
            len: mapped_len,
            is_pmem: false,
        };
        if mapped_len == 0 {
            return Err(PersistError::EmptyFile {
                path: path.to_owned(),
            });
        }
        // SAFETY: the whole range was just mapped by pmem_map_file.
        mapping.is_pmem = unsafe { sys::pmem_is_pmem(addr, mapped_len) } != 0;
        Ok(mapping)
    }

    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `pmem_persist` is enough to make stores durable.
    pub(crate) fn is_pmem(&self) -> bool {
        self.is_pmem
    }

    /// Makes `len` bytes at `offset` durable: `pmem_persist` on persistent
    /// memory, `pmem_msync` elsewhere.
    ///
    /// # Safety
    ///
    /// `[offset, offset + len)` must lie inside the mapping.
    pub(crate) unsafe fn persist(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: the caller keeps offset inside the mapping.
        let addr = unsafe { self.base.as_ptr().add(offset) }.cast::<core::ffi::c_void>();
        if self.is_pmem {
            // SAFETY: the range is inside this live mapping.
            unsafe { sys::pmem_persist(addr, len) };
            Ok(())
        } else {
            // SAFETY: the range is inside this live mapping; pmem_msync widens
            // it to whole pages, which are mapped too.
            let rc = unsafe { sys::pmem_msync(addr, len) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
    }

    /// Copies `src` to `offset` and makes it durable with
    /// `pmem_memcpy_persist`.
    ///
    /// # Safety
    ///
    /// `[offset, offset + src.len())` must lie inside the mapping, and the
    /// mapping must be persistent memory ([`is_pmem`](Self::is_pmem)).
    pub(crate) unsafe fn memcpy_persist(&self, offset: usize, src: &[u8]) {
        // SAFETY: the caller keeps the range inside the mapping.
        let dst = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: `dst` is writable for src.len() bytes inside the mapping;
        // `src` is a caller buffer, never part of the mapping (PmemMap hands
        // out no slices of it), so they do not overlap.
        unsafe {
            sys::pmem_memcpy_persist(dst.cast(), src.as_ptr().cast(), src.len());
        }
    }
}

impl Drop for LibpmemMapping {
    fn drop(&mut self) {
        // SAFETY: base/len are what pmem_map_file returned; the owning
        // PmemMap is being dropped, so nothing accesses the range afterwards.
        // A failure cannot be acted upon.
        unsafe {
            sys::pmem_unmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// libpmem's description of the last error on this thread.
fn last_error() -> String {
    // SAFETY: the text is copied out at once, before any other libpmem call
    // on this thread.
    let msg = unsafe { sys::pmem_errormsg() };
    if msg.is_null() {
        return io::Error::last_os_error().to_string();
    }
    // SAFETY: a non-null pmem_errormsg result is a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    if text.is_empty() {
        io::Error::last_os_error().to_string()
    } else {
        text
    }
}
