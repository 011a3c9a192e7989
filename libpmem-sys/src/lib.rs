//! Hand-written bindings to the few functions of libpmem (PMDK) that
//! pmem-server uses: mapping a file, asking whether a mapping is persistent
//! memory, making ranges durable, and reading libpmem's error text.
//!
//! The declarations follow `libpmem.h` of PMDK's pmem API version 1.1 on
//! Unix-like systems (the Windows `…U`/`…W` variants are not bound). See
//! libpmem(7), pmem_is_pmem(3), pmem_flush(3) and pmem_memmove_persist(3).
//!
//! The build script links the system library (`-lpmem`, located with
//! `pkg-config` when available).
//!
//! libpmem reads two environment variables that matter for tests:
//! `PMEM_IS_PMEM_FORCE=1` makes [`pmem_is_pmem`] report every range as
//! persistent memory (and `=0` as not), and `PMEM_NO_CLWB` / `PMEM_NO_CLFLUSHOPT`
//! restrict the flush instructions it uses. They are read once, on first use.

use core::ffi::{c_char, c_int, c_void};

pub use libc::{mode_t, size_t};

/// [`pmem_map_file`] flag: create the file if it does not exist; `len` must
/// then be non-zero and the file is extended or truncated to `len` and fully
/// allocated with posix_fallocate(3).
pub const PMEM_FILE_CREATE: c_int = 1 << 0;
/// [`pmem_map_file`] flag, with [`PMEM_FILE_CREATE`]: fail with `EEXIST` if
/// the file already exists.
pub const PMEM_FILE_EXCL: c_int = 1 << 1;
/// [`pmem_map_file`] flag, with [`PMEM_FILE_CREATE`]: size the file with
/// ftruncate(2) (sparse) instead of allocating it.
pub const PMEM_FILE_SPARSE: c_int = 1 << 2;
/// [`pmem_map_file`] flag, with [`PMEM_FILE_CREATE`]: map an unnamed
/// temporary file created in the directory `path`.
pub const PMEM_FILE_TMPFILE: c_int = 1 << 3;

unsafe extern "C" {
    /// Maps the file `path` read-write and shared.
    ///
    /// Without [`PMEM_FILE_CREATE`] in `flags`, the whole existing file is
    /// mapped, `len` must be 0 and `mode` is ignored. With it, the file is
    /// opened or created (with permissions `mode`) and sized to `len`, which
    /// must be non-zero.
    ///
    /// On success returns the address of the mapping and stores its length in
    /// `*mapped_lenp` and, in `*is_pmemp`, whether the file is persistent
    /// memory (non-zero) or needs msync(2) to be made durable (zero). On
    /// failure returns null, sets `errno`, leaves both outputs untouched, and
    /// [`pmem_errormsg`] describes the error.
    ///
    /// # Safety
    ///
    /// `path` must point to a NUL-terminated string valid for reads for the
    /// duration of the call. `mapped_lenp` and `is_pmemp` must each be null or
    /// valid for a write of their type. The returned mapping must be released
    /// only with [`pmem_unmap`] using the reported length, and every access to
    /// it must stay within that length and happen before the unmap.
    pub fn pmem_map_file(
        path: *const c_char,
        len: size_t,
        flags: c_int,
        mode: mode_t,
        mapped_lenp: *mut size_t,
        is_pmemp: *mut c_int,
    ) -> *mut c_void;

    /// Removes every mapping in `[addr, addr + len)` with munmap(2). Returns 0
    /// on success, or -1 with `errno` set.
    ///
    /// # Safety
    ///
    /// `addr` must be the start of a mapping returned by [`pmem_map_file`] and
    /// `len` its mapped length. No reference or pointer into the range may be
    /// used after the call; any later access faults or hits an unrelated
    /// mapping.
    pub fn pmem_unmap(addr: *mut c_void, len: size_t) -> c_int;

    /// Returns non-zero when the whole of `[addr, addr + len)` is persistent
    /// memory on which [`pmem_persist`] is enough to make stores durable, and
    /// zero when msync(2) (or [`pmem_msync`]) is needed. The check is costly;
    /// call it once per mapping and keep the answer. `PMEM_IS_PMEM_FORCE`
    /// overrides the answer.
    ///
    /// # Safety
    ///
    /// The range must lie inside a mapping created by [`pmem_map_file`] that
    /// is still mapped; for any other memory the result is undefined.
    pub fn pmem_is_pmem(addr: *const c_void, len: size_t) -> c_int;

    /// Writes back the CPU cache lines covering `[addr, addr + len)` and waits
    /// for the write-back to complete, making earlier stores to the range
    /// durable when the range is persistent memory. Does nothing useful for
    /// memory that [`pmem_is_pmem`] does not report as persistent; use
    /// [`pmem_msync`] there.
    ///
    /// # Safety
    ///
    /// Every byte of `[addr, addr + len)` must be mapped in this process for
    /// the duration of the call (the range may be rounded out to whole cache
    /// lines, which stay inside the same pages).
    pub fn pmem_persist(addr: *const c_void, len: size_t);

    /// Makes stores to `[addr, addr + len)` durable with msync(2) (`MS_SYNC`),
    /// widening the range to whole pages as msync requires. Works for any
    /// file mapping; has no effect on Device DAX. Returns 0 on success, or -1
    /// with `errno` set.
    ///
    /// # Safety
    ///
    /// The page-aligned range covering `[addr, addr + len)` must be mapped in
    /// this process for the duration of the call.
    pub fn pmem_msync(addr: *const c_void, len: size_t) -> c_int;

    /// Copies `len` bytes from `src` to `pmemdest` and makes them durable
    /// before returning (like memcpy(3) followed by [`pmem_persist`], possibly
    /// using non-temporal stores). Returns `pmemdest`. Only meaningful where
    /// [`pmem_is_pmem`] is true.
    ///
    /// # Safety
    ///
    /// `pmemdest` must be valid for writes of `len` bytes inside a live
    /// mapping, `src` valid for reads of `len` bytes, and the two ranges must
    /// not overlap. Other threads accessing the destination at the same time
    /// race with the copy (the caller's concurrency contract must allow it).
    pub fn pmem_memcpy_persist(
        pmemdest: *mut c_void,
        src: *const c_void,
        len: size_t,
    ) -> *mut c_void;

    /// Returns the text of the last error a libpmem call reported on this
    /// thread, as a NUL-terminated string owned by libpmem (possibly empty).
    ///
    /// # Safety
    ///
    /// The returned pointer must only be read, and only before the next
    /// libpmem call on the same thread, which may overwrite the buffer.
    pub fn pmem_errormsg() -> *const c_char;

}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c_path(path: &Path) -> CString {
        CString::new(path.as_os_str().as_bytes()).expect("temp path has no NUL")
    }

    /// What `PMEM_IS_PMEM_FORCE` (set by whoever runs the tests) says
    /// pmem_is_pmem must return, if anything.
    fn forced_is_pmem() -> Option<bool> {
        match std::env::var("PMEM_IS_PMEM_FORCE").ok()?.as_str() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        }
    }

    #[test]
    fn create_map_write_persist_unmap() {
        const LEN: usize = 64 * 1024;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("region");
        let c = c_path(&path);
        let mut mapped_len: size_t = 0;
        let mut is_pmem: c_int = -1;
        // SAFETY: `c` is NUL-terminated and outlives the call; both out
        // pointers point to live locals.
        let addr = unsafe {
            pmem_map_file(
                c.as_ptr(),
                LEN,
                PMEM_FILE_CREATE | PMEM_FILE_EXCL,
                0o600,
                &mut mapped_len,
                &mut is_pmem,
            )
        };
        assert!(!addr.is_null(), "pmem_map_file failed: {}", last_error());
        assert_eq!(mapped_len, LEN);
        assert!(is_pmem == 0 || is_pmem == 1);

        // SAFETY: the range is the whole mapping just created.
        let detected = unsafe { pmem_is_pmem(addr, mapped_len) } != 0;
        if let Some(expected) = forced_is_pmem() {
            assert_eq!(detected, expected);
        }

        let pattern: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let dest = addr.cast::<u8>().wrapping_add(1000);
        // SAFETY: [1000, 1000 + 4096) is inside the LEN-byte mapping, the
        // source is a separate heap buffer, and no one else uses the mapping.
        unsafe {
            pmem_memcpy_persist(dest.cast(), pattern.as_ptr().cast(), pattern.len());
        }
        // SAFETY: inside the mapping; pmem_persist is legal on any mapped
        // memory (it only writes cache lines back).
        unsafe { pmem_persist(dest.cast(), pattern.len()) };
        // SAFETY: inside the mapping, which is a file mapping msync accepts.
        let rc = unsafe { pmem_msync(dest.cast(), pattern.len()) };
        assert_eq!(rc, 0, "pmem_msync: {}", std::io::Error::last_os_error());
        // SAFETY: `addr`/`mapped_len` are exactly what pmem_map_file returned
        // and nothing touches the mapping afterwards.
        let rc = unsafe { pmem_unmap(addr, mapped_len) };
        assert_eq!(rc, 0, "pmem_unmap: {}", std::io::Error::last_os_error());

        let contents = std::fs::read(&path).expect("read back");
        assert_eq!(contents.len(), LEN);
        assert_eq!(&contents[1000..1000 + 4096], &pattern[..]);
        assert!(contents[..1000].iter().all(|&b| b == 0));
    }

    #[test]
    fn maps_whole_existing_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("existing");
        std::fs::write(&path, vec![7u8; 8192]).expect("write file");
        let c = c_path(&path);
        let mut mapped_len: size_t = 0;
        // SAFETY: `c` is NUL-terminated; `mapped_len` is a live local and the
        // is_pmem output is not requested.
        let addr =
            unsafe { pmem_map_file(c.as_ptr(), 0, 0, 0, &mut mapped_len, core::ptr::null_mut()) };
        assert!(!addr.is_null(), "pmem_map_file failed: {}", last_error());
        assert_eq!(mapped_len, 8192);
        // SAFETY: offset 8191 is the last byte of the 8192-byte mapping.
        let last = unsafe { addr.cast::<u8>().add(8191).read() };
        assert_eq!(last, 7);
        // SAFETY: exactly the mapping returned above, not used afterwards.
        assert_eq!(unsafe { pmem_unmap(addr, mapped_len) }, 0);
    }

    #[test]
    fn missing_file_reports_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = c_path(&dir.path().join("does-not-exist"));
        // SAFETY: `c` is NUL-terminated; no outputs are requested.
        let addr = unsafe {
            pmem_map_file(
                c.as_ptr(),
                0,
                0,
                0,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert!(addr.is_null());
        assert_eq!(errno, Some(libc::ENOENT));
        assert!(!last_error().is_empty());
    }

    fn last_error() -> String {
        // SAFETY: the string is copied out immediately, before any other
        // libpmem call on this thread.
        let msg = unsafe { pmem_errormsg() };
        if msg.is_null() {
            return String::new();
        }
        // SAFETY: non-null results of pmem_errormsg are NUL-terminated.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}
