//! An `AF_XDP` socket in copy mode: a UMEM of equal chunks, and the four
//! rings it shares with the kernel (fill, receive, transmit, completion).
//!
//! The first half of the chunks receives: they start on the fill ring, the
//! kernel copies a frame into one and names it on the receive ring, and the
//! device puts it back on the fill ring once the frame was handled. The
//! second half sends: a free chunk takes a frame, the transmit ring names
//! it, one `sendto` per batch tells the kernel, and the completion ring
//! hands the chunk back. Each chunk is in exactly one place at a time, so
//! the device never reads a chunk the kernel may write or the reverse.
//!
//! Descriptors come from the kernel, but every address and length is
//! checked against the UMEM and its chunk before a byte is read.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::super::mapping::Mapping;

/// The smallest chunk the kernel allows.
const MIN_CHUNK: usize = 2048;
/// Bytes the kernel keeps before a received frame in its chunk
/// (`XDP_PACKET_HEADROOM`).
const KERNEL_HEADROOM: usize = 256;
/// Bytes of a `struct xdp_desc`.
const DESC_LEN: usize = 16;
/// The smallest frame handed on: an Ethernet header.
const MIN_FRAME: usize = 14;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// The kernel has no `AF_XDP`, or the caller lacks the right.
    #[error("opening an AF_XDP socket refused")]
    Socket(#[source] io::Error),
    /// A socket option was refused.
    #[error("setsockopt {option} refused")]
    Option {
        /// The option.
        option: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Mapping the UMEM or a ring failed.
    #[error("mmap of the {what} ({bytes} B) failed")]
    Map {
        /// Which.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Binding to the interface's queue was refused.
    #[error("binding the AF_XDP socket to interface {ifindex} queue {queue} refused")]
    Bind {
        /// The interface.
        ifindex: u32,
        /// The queue.
        queue: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Maps `len` bytes for `what` (see [`Mapping::new`]).
fn map(
    what: &'static str,
    len: usize,
    fd: Option<RawFd>,
    offset: u64,
) -> Result<Mapping, XskError> {
    Mapping::new(len, fd, offset).map_err(|source| XskError::Map {
        what,
        bytes: len,
        source,
    })
}

/// One ring shared with the kernel: its producer and consumer words and
/// its entries, `mask + 1` of them (a power of two).
#[derive(Debug)]
struct Ring {
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    entries: *mut u8,
    mask: u32,
    entry_len: usize,
}

impl Ring {
    fn map(
        fd: RawFd,
        what: &'static str,
        offsets: &libc::xdp_ring_offset,
        page: u64,
        entries: u32,
        entry_len: usize,
    ) -> Result<Self, XskError> {
        let len = offsets.desc as usize + entries as usize * entry_len;
        let map = map(what, len, Some(fd), page)?;
        Ok(Ring {
            producer: map.at(offsets.producer).cast(),
            consumer: map.at(offsets.consumer).cast(),
            entries: map.at(offsets.desc),
            _map: map,
            mask: entries - 1,
            entry_len,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: the word lies inside the live mapping at the offset the
        // kernel gave, aligned by it, and is only accessed atomically.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    /// Entry `index` (taken modulo the ring).
    fn entry(&self, index: u32) -> *mut u8 {
        // SAFETY: `index & mask` is below the ring's entry count, so the
        // entry lies inside the mapping.
        unsafe {
            self.entries
                .add((index & self.mask) as usize * self.entry_len)
        }
    }

    fn size(&self) -> u32 {
        self.mask + 1
    }
}

/// A received frame's descriptor, read from the receive ring.
fn read_desc(ring: &Ring, index: u32) -> (u64, u32) {
    let at = ring.entry(index);
    // SAFETY: a descriptor is 16 bytes at `at`, inside the mapping; the
    // kernel published it before the producer word this index is below.
    unsafe {
        (
            at.cast::<u64>().read_unaligned(),
            at.add(8).cast::<u32>().read_unaligned(),
        )
    }
}

/// The shape of a socket: chunk size and ring size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskShape {
    /// Bytes per chunk (a power of two, 2 KiB to a page).
    pub chunk: usize,
    /// Entries of each ring, and chunks of each half of the UMEM.
    pub ring: u32,
}

impl XskShape {
    /// Chunks big enough for frames of `frame_cap` bytes, `ring` of them
    /// per direction (rounded up to a power of two); `None` if a frame
    /// does not fit a page.
    pub fn new(frame_cap: usize, ring: usize, page: usize) -> Option<Self> {
        let chunk = (KERNEL_HEADROOM + frame_cap)
            .next_power_of_two()
            .max(MIN_CHUNK);
        (chunk <= page).then_some(XskShape {
            chunk,
            ring: ring.next_power_of_two() as u32,
        })
    }

    /// Bytes of the UMEM.
    pub fn umem_bytes(&self) -> usize {
        2 * self.ring as usize * self.chunk
    }
}

/// Counters the socket keeps and the kernel's own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XskCounters {
    /// Frames dropped on receive (no chunk on the fill ring, ring full).
    pub rx_dropped: u64,
    /// Frames not sent (no free chunk or room on the ring, too long).
    pub tx_dropped: u64,
    /// Receive descriptors outside the UMEM or their chunk, skipped.
    pub malformed: u64,
}

/// An `AF_XDP` socket bound to one queue of an interface.
#[derive(Debug)]
pub struct XskSocket {
    fd: OwnedFd,
    shape: XskShape,
    umem: Mapping,
    fill: Ring,
    rx: Ring,
    sending: Sending,
    completion: Ring,
    malformed: u64,
}

/// The transmit ring and the chunks of the sending half.
#[derive(Debug)]
struct Sending {
    ring: Ring,
    chunk: usize,
    /// Chunks of the sending half not on the transmit ring.
    free: Vec<u64>,
    /// Transmit entries written and not yet published.
    pending: u32,
    /// Frames not sent.
    dropped: u64,
}

impl Sending {
    fn sender<'a>(&'a mut self, umem: &'a Mapping) -> XskSender<'a> {
        XskSender {
            umem,
            sending: self,
        }
    }
}

fn set<T>(fd: RawFd, option: libc::c_int, name: &'static str, value: &T) -> Result<(), XskError> {
    // SAFETY: the option value is a live `T` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            option,
            std::ptr::from_ref(value).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(XskError::Option {
            option: name,
            source: io::Error::last_os_error(),
        })
    }
}

impl XskSocket {
    /// Opens a socket on queue `queue` of interface `ifindex` in copy mode,
    /// with a UMEM and rings of `shape`, every receive chunk on the fill
    /// ring.
    pub fn open(ifindex: u32, queue: u32, shape: XskShape) -> Result<Self, XskError> {
        // SAFETY: plain socket creation.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(XskError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = map("UMEM", shape.umem_bytes(), None, 0)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.base().as_ptr() as u64,
            len: shape.umem_bytes() as u64,
            chunk_size: shape.chunk as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        set(raw, libc::XDP_UMEM_REG, "XDP_UMEM_REG", &reg)?;
        let n = shape.ring;
        set(raw, libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING", &n)?;
        set(
            raw,
            libc::XDP_UMEM_COMPLETION_RING,
            "XDP_UMEM_COMPLETION_RING",
            &n,
        )?;
        set(raw, libc::XDP_RX_RING, "XDP_RX_RING", &n)?;
        set(raw, libc::XDP_TX_RING, "XDP_TX_RING", &n)?;
        // SAFETY: all zeroes is a valid xdp_mmap_offsets.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is live and `len` its size.
        let rc = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&raw mut off).cast(),
                &raw mut len,
            )
        };
        if rc != 0 || len as usize != size_of::<libc::xdp_mmap_offsets>() {
            return Err(XskError::Option {
                option: "XDP_MMAP_OFFSETS",
                source: if rc != 0 {
                    io::Error::last_os_error()
                } else {
                    io::Error::other("the kernel's ring offsets are of an older layout")
                },
            });
        }
        let fill = Ring::map(
            raw,
            "fill ring",
            &off.fr,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            n,
            8,
        )?;
        let completion = Ring::map(
            raw,
            "completion ring",
            &off.cr,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            n,
            8,
        )?;
        let rx = Ring::map(
            raw,
            "receive ring",
            &off.rx,
            libc::XDP_PGOFF_RX_RING as u64,
            n,
            DESC_LEN,
        )?;
        let tx = Ring::map(
            raw,
            "transmit ring",
            &off.tx,
            libc::XDP_PGOFF_TX_RING as u64,
            n,
            DESC_LEN,
        )?;
        let chunk = shape.chunk as u64;
        for i in 0..n {
            // SAFETY: entry `i` of the fill ring is 8 bytes inside its
            // mapping, and the kernel reads none until the producer moves.
            unsafe {
                fill.entry(i)
                    .cast::<u64>()
                    .write_unaligned(u64::from(i) * chunk)
            };
        }
        fill.producer().store(n, Ordering::Release);
        let free = (n..2 * n).map(|i| u64::from(i) * chunk).collect();
        // SAFETY: all zeroes is a valid sockaddr_xdp.
        let mut addr: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
        addr.sxdp_family = libc::AF_XDP as u16;
        addr.sxdp_flags = libc::XDP_COPY;
        addr.sxdp_ifindex = ifindex;
        addr.sxdp_queue_id = queue;
        // SAFETY: `addr` is a live sockaddr_xdp of the size passed.
        let rc = unsafe {
            libc::bind(
                raw,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(XskError::Bind {
                ifindex,
                queue,
                source: io::Error::last_os_error(),
            });
        }
        Ok(XskSocket {
            fd,
            shape,
            umem,
            fill,
            rx,
            sending: Sending {
                ring: tx,
                chunk: shape.chunk,
                free,
                pending: 0,
                dropped: 0,
            },
            completion,
            malformed: 0,
        })
    }

    /// The socket's shape.
    pub fn shape(&self) -> XskShape {
        self.shape
    }

    /// Hands every received frame to `each` with room to answer, returns
    /// each chunk to the fill ring, and says how many frames came.
    pub fn receive(&mut self, mut each: impl FnMut(&[u8], &mut XskSender<'_>)) -> usize {
        let start = self.rx.consumer().load(Ordering::Relaxed);
        let end = self.rx.producer().load(Ordering::Acquire);
        let count = end.wrapping_sub(start);
        let chunk = self.shape.chunk as u64;
        let half = u64::from(self.shape.ring) * chunk;
        let mut fill_at = self.fill.producer().load(Ordering::Relaxed);
        for i in 0..count {
            let (addr, len) = read_desc(&self.rx, start.wrapping_add(i));
            let base = addr & !(chunk - 1);
            let len = len as usize;
            if base < half && (addr - base) as usize + len <= self.shape.chunk && len >= MIN_FRAME {
                // SAFETY: the descriptor names `len` bytes inside one chunk
                // of the receiving half (checked above); the kernel wrote
                // them before it published the descriptor and will not
                // touch the chunk until it is back on the fill ring.
                let frame = unsafe { std::slice::from_raw_parts(self.umem.at(addr), len) };
                each(frame, &mut self.sending.sender(&self.umem));
            } else {
                self.malformed += 1;
            }
            if base < half {
                // SAFETY: entry `fill_at` of the fill ring is inside its
                // mapping, and free: the fill ring holds at most every
                // receiving chunk, and this one is not on it.
                unsafe { self.fill.entry(fill_at).cast::<u64>().write_unaligned(base) };
                fill_at = fill_at.wrapping_add(1);
            }
        }
        if count > 0 {
            self.fill.producer().store(fill_at, Ordering::Release);
            self.rx.consumer().store(end, Ordering::Release);
        }
        count as usize
    }

    /// A sender for frames (see [`XskSender::slot`]).
    pub fn sender(&mut self) -> XskSender<'_> {
        self.sending.sender(&self.umem)
    }

    /// Whether frames wait to be sent.
    pub fn has_pending(&self) -> bool {
        self.sending.pending > 0
    }

    /// Publishes the frames written and tells the kernel (one `sendto`);
    /// takes back the chunks it finished sending. Returns how many frames
    /// were published.
    pub fn flush(&mut self) -> u32 {
        let pending = std::mem::take(&mut self.sending.pending);
        if pending > 0 {
            let tx = &self.sending.ring;
            let at = tx.producer().load(Ordering::Relaxed);
            tx.producer()
                .store(at.wrapping_add(pending), Ordering::Release);
            // SAFETY: a send with no data on our own socket: the kernel
            // takes the transmit ring's new entries.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if rc < 0 {
                // EAGAIN/EBUSY/ENOBUFS: the entries stay on the ring and
                // go with the next call; nothing else is expected here.
                let e = io::Error::last_os_error();
                tracing::trace!("AF_XDP sendto: {e}");
            }
        }
        self.reap();
        pending
    }

    /// Takes the chunks the kernel finished sending back.
    fn reap(&mut self) {
        let start = self.completion.consumer().load(Ordering::Relaxed);
        let end = self.completion.producer().load(Ordering::Acquire);
        let chunk = self.shape.chunk as u64;
        let half = u64::from(self.shape.ring) * chunk;
        for i in 0..end.wrapping_sub(start) {
            // SAFETY: an 8-byte entry inside the completion ring's mapping,
            // published by the kernel before the producer word.
            let addr = unsafe {
                self.completion
                    .entry(start.wrapping_add(i))
                    .cast::<u64>()
                    .read_unaligned()
            };
            let base = addr & !(chunk - 1);
            let free = &mut self.sending.free;
            if (half..2 * half).contains(&base) && free.len() < self.shape.ring as usize {
                free.push(base);
            } else {
                self.malformed += 1;
            }
        }
        self.completion.consumer().store(end, Ordering::Release);
    }

    /// The socket's counters with the kernel's statistics.
    pub fn counters(&self) -> XskCounters {
        // SAFETY: all zeroes is a valid xdp_statistics.
        let mut stats: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `stats` is live and `len` its size.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&raw mut stats).cast(),
                &raw mut len,
            )
        };
        let rx_dropped = if rc == 0 {
            stats.rx_dropped + stats.rx_ring_full + stats.rx_fill_ring_empty_descs
        } else {
            0
        };
        XskCounters {
            rx_dropped,
            tx_dropped: self.sending.dropped,
            malformed: self.malformed,
        }
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Writes frames into free chunks of the sending half and names them on
/// the transmit ring (published at the socket's next flush).
pub struct XskSender<'a> {
    umem: &'a Mapping,
    sending: &'a mut Sending,
}

impl<'a> XskSender<'a> {
    /// Room for a frame of `len` bytes, sent at the next flush; `None`
    /// (counted as dropped) when too long or when no chunk or ring entry
    /// is free. The room is a chunk of its own, so it may outlive the
    /// sender (not the borrow of the socket).
    pub fn slot(&mut self, len: usize) -> Option<&'a mut [u8]> {
        let s = &mut *self.sending;
        let consumed = s.ring.consumer().load(Ordering::Acquire);
        let at = s
            .ring
            .producer()
            .load(Ordering::Relaxed)
            .wrapping_add(s.pending);
        let ring_full = at.wrapping_sub(consumed) >= s.ring.size();
        if len > s.chunk || ring_full {
            s.dropped += 1;
            return None;
        }
        let Some(addr) = s.free.pop() else {
            s.dropped += 1;
            return None;
        };
        let entry = s.ring.entry(at);
        // SAFETY: a 16-byte descriptor inside the transmit ring's mapping
        // that the kernel does not read until the producer passes it.
        unsafe {
            entry.cast::<u64>().write_unaligned(addr);
            entry.add(8).cast::<u32>().write_unaligned(len as u32);
            entry.add(12).cast::<u32>().write_unaligned(0);
        }
        s.pending += 1;
        // SAFETY: `addr` is a chunk of the sending half that was free, so
        // neither the kernel nor another slot uses it; `len` fits it.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.at(addr), len) })
    }
}
