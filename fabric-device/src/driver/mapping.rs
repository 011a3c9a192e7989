//! A memory mapping the device shares with the kernel (packet rings, an
//! `AF_XDP` socket's UMEM and rings), unmapped when dropped.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// A readable and writable mapping, populated at once.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset` (shared with the kernel), or
    /// `len` bytes of fresh anonymous memory when `fd` is `None`.
    pub fn new(len: usize, fd: Option<RawFd>, offset: u64) -> io::Result<Self> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        let offset = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a fresh mapping the kernel places, aliasing nothing; the
        // result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(io::ErrorKind::InvalidData)?;
        Ok(Mapping { ptr, len })
    }

    /// The first byte (page-aligned).
    pub fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// A pointer `at` bytes in; `at` must lie inside the mapping.
    pub fn at(&self, at: u64) -> *mut u8 {
        assert!(
            (at as usize) < self.len,
            "offset {at} outside a mapping of {}",
            self.len
        );
        // SAFETY: `at` is inside the mapping (checked above).
        unsafe { self.ptr.as_ptr().add(at as usize) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are what `mmap` returned; whatever points
        // into the mapping is dropped with it (fields of the same owner)
        // and never dereferences in its own drop.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// SAFETY: the mapping is plain memory shared with the kernel; what points
// into it moves with it between threads, never shared.
unsafe impl Send for Mapping {}
