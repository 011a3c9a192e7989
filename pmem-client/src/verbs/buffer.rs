//! The local buffer work requests read from and write into: one
//! page-aligned heap allocation, registered once, handed out as a ring of
//! slots that complete in posting order (an RC send queue completes in
//! order).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Slots start on this boundary (8 would do for atomics; a cache line
/// keeps slots apart).
pub(crate) const SLOT_ALIGN: usize = 64;
const PAGE: usize = 4096;

/// A zeroed, page-aligned allocation the RNIC may access through its MR.
#[derive(Debug)]
pub(crate) struct DmaBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value alone; moving it to another
// thread moves that ownership, and nothing here is tied to a thread.
unsafe impl Send for DmaBuffer {}

impl DmaBuffer {
    /// Allocates `len` bytes (at least one page).
    pub(crate) fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(PAGE).next_multiple_of(PAGE), PAGE).ok()?;
        // SAFETY: the layout's size is at least one page, so not zero.
        let ptr = unsafe { alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| DmaBuffer { ptr, layout })
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// Its address, as verbs takes it.
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Copies `data` into the buffer at `at`.
    ///
    /// # Safety
    ///
    /// `at..at + data.len()` must lie in the buffer and no posted work
    /// request may be using it.
    pub(crate) unsafe fn put(&self, at: usize, data: &[u8]) {
        debug_assert!(at + data.len() <= self.len());
        // SAFETY: in bounds and not accessed by the RNIC, per the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len());
        }
    }

    /// Copies `len` bytes at `at` out of the buffer.
    ///
    /// # Safety
    ///
    /// `at..at + len` must lie in the buffer and the work request that
    /// wrote it must have completed.
    pub(crate) unsafe fn get(&self, at: usize, len: usize) -> Vec<u8> {
        debug_assert!(at + len <= self.len());
        let mut out = vec![0; len];
        // SAFETY: in bounds and no longer written by the RNIC, per the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), out.as_mut_ptr(), len);
        }
        out
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout and freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Where the next slot of `len` bytes goes in a ring of `size` bytes whose
/// live slots start at `oldest` (none when `None`) and whose next free byte
/// is `head`; returns the slot's offset and the new head.
pub(crate) fn place(
    size: usize,
    head: usize,
    oldest: Option<usize>,
    len: usize,
) -> Option<(usize, usize)> {
    let len = len.max(1).next_multiple_of(SLOT_ALIGN);
    let fits = |at: usize, limit: usize| (at + len <= limit).then_some((at, at + len));
    match oldest {
        None => fits(0, size),
        // Not wrapped: free space is [head, size) and then [0, oldest).
        Some(tail) if head > tail => fits(head, size).or_else(|| fits(0, tail)),
        // Wrapped: free space is [head, oldest).
        Some(tail) => fits(head, tail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_wrap_around_and_never_overlap_live_ones() {
        // Empty: from the start.
        assert_eq!(place(1024, 512, None, 100), Some((0, 128)));
        // Live [0, 512): the rest of the buffer, then nothing.
        assert_eq!(place(1024, 512, Some(0), 512), Some((512, 1024)));
        assert_eq!(place(1024, 1024, Some(0), 1), None);
        // Live [256, 1024): wraps to the start, up to the oldest slot.
        assert_eq!(place(1024, 1024, Some(256), 256), Some((0, 256)));
        assert_eq!(place(1024, 1024, Some(256), 257), None);
        // Wrapped, head 64, oldest 256: [64, 256) is free.
        assert_eq!(place(1024, 64, Some(256), 192), Some((64, 256)));
        assert_eq!(place(1024, 64, Some(256), 193), None);
        // Atomics get aligned slots.
        assert_eq!(place(1024, 64, Some(0), 8), Some((64, 128)));
    }

    #[test]
    fn the_buffer_is_page_aligned_zeroed_and_copies_both_ways() {
        let buffer = DmaBuffer::new(100).expect("allocation");
        assert_eq!(buffer.len(), PAGE);
        assert_eq!(buffer.addr() % PAGE, 0);
        // SAFETY: in bounds, and no RNIC uses this buffer.
        unsafe {
            assert_eq!(buffer.get(0, 16), [0; 16]);
            buffer.put(4090, b"abcdef");
            assert_eq!(buffer.get(4090, 6), b"abcdef");
        }
    }
}
