//! Copying into the mapping with non-temporal stores, which go around the CPU
//! cache (write-combining) instead of leaving dirty lines behind.
//!
//! Only naturally aligned 8- and 16-byte pieces can be streamed; the bytes
//! before the first 8-byte boundary and after the last one are copied with
//! ordinary stores and reported back, so that a DAX mapping can write their
//! cache lines back. Nothing here fences: the caller issues
//! [`store_fence`](super::cacheline::store_fence) once it has also written
//! back the ordinary edges.

use std::ops::Range;

/// The parts of a streamed copy that went through the cache, as byte ranges
/// relative to the destination start. Empty ranges when nothing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedEdges {
    /// Bytes stored normally before the streamed middle.
    pub(crate) head: Range<usize>,
    /// Bytes stored normally after the streamed middle.
    pub(crate) tail: Range<usize>,
}

/// Copies `src` to `dst`, streaming every aligned 8/16-byte piece with
/// non-temporal stores (x86_64 `MOVNTI`/`MOVNTDQ`) and storing the unaligned
/// edges normally. On other targets everything is an ordinary copy and is
/// reported as the head.
///
/// The streamed stores are weakly ordered: they become visible (and, on
/// persistent memory, durable) only after a store fence.
///
/// # Safety
///
/// `dst` must be valid for writes of `src.len()` bytes and must not overlap
/// `src`. Concurrent non-atomic access to the destination by other threads
/// follows the concurrency contract in [`super`]: the bytes may tear.
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) -> CachedEdges {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: forwarded caller contract.
        unsafe { copy_streaming_x86_64(dst, src) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller guarantees `dst` is writable for `src.len()`
        // bytes and does not overlap `src`.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        CachedEdges {
            head: 0..src.len(),
            tail: src.len()..src.len(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_x86_64(dst: *mut u8, src: &[u8]) -> CachedEdges {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si64, _mm_stream_si128};
    use core::ptr;

    let len = src.len();
    let s = src.as_ptr();

    // Ordinary stores up to the first 8-byte boundary.
    let head = (dst.addr().wrapping_neg() % 8).min(len);
    // SAFETY: head <= len, so both ranges are inside the caller's buffers,
    // which do not overlap.
    unsafe { ptr::copy_nonoverlapping(s, dst, head) };
    let mut done = head;

    // One 8-byte stream to reach a 16-byte boundary.
    if len - done >= 8 && !(dst.addr() + done).is_multiple_of(16) {
        // SAFETY: dst + done is 8-aligned (past the head) and the 8 bytes at
        // `done` are inside both buffers; the source read is unaligned-safe.
        unsafe {
            let word = ptr::read_unaligned(s.add(done).cast::<i64>());
            _mm_stream_si64(dst.add(done).cast::<i64>(), word);
        }
        done += 8;
    }

    // 16-byte streams for the aligned middle.
    while len - done >= 16 {
        // SAFETY: dst + done is 16-aligned here (it is 8-aligned and the step
        // above fixed the remaining bit whenever 8 or more bytes remained),
        // and 16 bytes at `done` are inside both buffers. The load is the
        // unaligned variant. SSE2 is part of the x86_64 baseline.
        unsafe {
            let chunk = _mm_loadu_si128(s.add(done).cast::<__m128i>());
            _mm_stream_si128(dst.add(done).cast::<__m128i>(), chunk);
        }
        done += 16;
    }

    // A last 8-byte stream.
    if len - done >= 8 {
        // SAFETY: dst + done is 8-aligned (the head made it so, and every step
        // since was a multiple of 8); 8 bytes at `done` are inside both buffers.
        unsafe {
            let word = ptr::read_unaligned(s.add(done).cast::<i64>());
            _mm_stream_si64(dst.add(done).cast::<i64>(), word);
        }
        done += 8;
    }

    // Ordinary stores for the remaining < 8 bytes.
    // SAFETY: [done, len) is inside both buffers, which do not overlap.
    unsafe { ptr::copy_nonoverlapping(s.add(done), dst.add(done), len - done) };

    CachedEdges {
        head: 0..head,
        tail: done..len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::cacheline::store_fence;

    #[test]
    fn streams_every_alignment_and_length() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for dst_offset in 0..32 {
            for len in 0..=200 {
                let mut dst = vec![0xAAu8; 300];
                let edges = {
                    let p = dst.as_mut_ptr().wrapping_add(dst_offset);
                    // SAFETY: dst_offset + len <= 232 < 300, and `dst` and
                    // `src` are distinct allocations.
                    unsafe { copy_streaming(p, &src[..len]) }
                };
                store_fence();
                assert_eq!(&dst[dst_offset..dst_offset + len], &src[..len]);
                assert!(dst[..dst_offset].iter().all(|&b| b == 0xAA));
                assert!(dst[dst_offset + len..].iter().all(|&b| b == 0xAA));
                assert!(edges.head.end <= edges.tail.start || edges.tail.is_empty());
                assert_eq!(edges.tail.end, len);
                if cfg!(target_arch = "x86_64") {
                    assert!(edges.head.len() < 8);
                    assert!(edges.tail.len() < 8);
                }
            }
        }
    }
}
