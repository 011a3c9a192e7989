//! A `PACKET_MMAP` receive ring and transmit ring (`TPACKET_V2`) on the
//! RoCEv2 port's `AF_PACKET` socket.
//!
//! The kernel writes each received frame into the next free slot of a ring
//! shared with the device (one `mmap` made at start) and marks the slot the
//! device's; the event loop walks the ring until it meets a slot the kernel
//! still owns, with no system call per frame or per batch, and hands each
//! slot back once its frame was handled. Outgoing frames are written into
//! the slots of the transmit ring, marked for sending, and one `send` with
//! no data tells the kernel to take every marked slot (one system call per
//! batch). The socket bypasses the queueing discipline on transmit.
//!
//! Each slot holds a `tpacket2_hdr`, the sender's `sockaddr_ll` and the
//! frame. The kernel fills the header, but every offset and length read
//! from it is checked against the slot before a byte of the frame is
//! touched: a slot whose header points outside itself is counted and
//! skipped.
//!
//! `TPACKET_V2` and not `TPACKET_V3`: a V3 block reaches the reader only
//! when it is full or its retire timer (at least 1 ms) fires, which adds up
//! to a millisecond to every request when the load is light; V2 hands over
//! each frame as it lands and wakes the loop for it.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::mapping::Mapping;
use super::packet::{BATCH, PacketSocket};

/// `TPACKET_V2` of `enum tpacket_versions`.
const TPACKET_V2: libc::c_int = 1;
/// Bytes of a slot before the kernel may place a received frame: the
/// header and the sender's address (`TPACKET2_HDRLEN`).
const RX_HEADER_LEN: usize = 32 + size_of::<libc::sockaddr_ll>();
/// Where a received frame starts in the worst case (`tp_mac` with a
/// 14-byte link header, aligned as the kernel aligns it), with room to spare.
const RX_FRAME_OFFSET: usize = 128;
/// Where the frame to send starts in a transmit slot: right after the
/// aligned `tpacket2_hdr` (the kernel's default without `PACKET_TX_HAS_OFF`).
const TX_DATA_OFFSET: usize = 32;
/// Offset of `sll_pkttype` in a slot (the `sockaddr_ll` follows the
/// aligned header).
const PKTTYPE_AT: usize = 32 + 10;
/// The smallest frame handed on: an Ethernet header.
const MIN_FRAME: usize = 14;

/// Slots per ring, each direction, unless configured.
pub const DEFAULT_RING_FRAMES: usize = 1024;
/// The fewest slots a ring may have.
pub const MIN_RING_FRAMES: usize = 16;
/// The most slots a ring may have.
pub const MAX_RING_FRAMES: usize = 32768;

/// The shape of one ring: slot size, slots, and the kernel's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingShape {
    /// Bytes per slot (a power of two).
    pub frame_size: usize,
    /// Slots in the ring.
    pub frames: usize,
    /// Bytes per kernel block (a multiple of the page size and of the slot).
    pub block_size: usize,
}

impl RingShape {
    /// Slots of at least `frame_cap` bytes of frame, `frames` of them
    /// (clamped to [`MIN_RING_FRAMES`]..=[`MAX_RING_FRAMES`] and rounded up
    /// to whole blocks of `page` bytes).
    pub fn new(frame_cap: usize, frames: usize, page: usize) -> RingShape {
        let frame_size = (RX_FRAME_OFFSET + frame_cap).next_power_of_two();
        let block_size = frame_size.max(page.next_power_of_two());
        let per_block = block_size / frame_size;
        let frames = frames.clamp(MIN_RING_FRAMES, MAX_RING_FRAMES);
        let frames = frames.div_ceil(per_block) * per_block;
        RingShape {
            frame_size,
            frames,
            block_size,
        }
    }

    /// Bytes of the ring.
    pub fn bytes(&self) -> usize {
        self.frame_size * self.frames
    }

    fn request(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_size as libc::c_uint,
            tp_block_nr: (self.bytes() / self.block_size) as libc::c_uint,
            tp_frame_size: self.frame_size as libc::c_uint,
            tp_frame_nr: self.frames as libc::c_uint,
        }
    }
}

/// What a received slot holds, read from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxSlot {
    /// A frame at `start`, `len` bytes long.
    Frame {
        /// Offset in the slot.
        start: usize,
        /// Length.
        len: usize,
    },
    /// A frame this host sent (seen where the kernel could not be told to skip them).
    Outgoing,
    /// A frame longer than the slot, cut short.
    Truncated,
    /// Offsets or lengths outside the slot, or shorter than an Ethernet header.
    Malformed,
}

fn read_u32(slot: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(slot.get(at..at + 4)?.try_into().ok()?))
}

fn read_u16(slot: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(slot.get(at..at + 2)?.try_into().ok()?))
}

/// Reads a received slot's header (`status` is its `tp_status`): where its
/// frame is, or why it is skipped. Every bound is checked against `slot`.
pub fn parse_rx_slot(slot: &[u8], status: u32) -> RxSlot {
    let (Some(len), Some(snaplen), Some(mac)) =
        (read_u32(slot, 4), read_u32(slot, 8), read_u16(slot, 12))
    else {
        return RxSlot::Malformed;
    };
    let (snaplen, mac) = (snaplen as usize, usize::from(mac));
    if mac < RX_HEADER_LEN || snaplen < MIN_FRAME || mac.saturating_add(snaplen) > slot.len() {
        return RxSlot::Malformed;
    }
    if status & libc::TP_STATUS_COPY != 0 || snaplen < len as usize {
        return RxSlot::Truncated;
    }
    if slot.get(PKTTYPE_AT) == Some(&libc::PACKET_OUTGOING) {
        return RxSlot::Outgoing;
    }
    RxSlot::Frame {
        start: mac,
        len: snaplen,
    }
}

/// The receive ring: slots the kernel fills, walked in order.
#[derive(Debug)]
pub struct RxRing {
    base: NonNull<u8>,
    shape: RingShape,
    /// The next slot to look at.
    head: usize,
    /// Slots handed out by the last [`RxRing::receive`], from `head`.
    taken: usize,
    /// Where the frame of each slot taken is (len 0: skipped).
    spans: [(usize, usize); BATCH],
    /// Slots whose header pointed outside the slot.
    pub malformed: u64,
    /// Frames longer than a slot, dropped.
    pub truncated: u64,
}

impl RxRing {
    /// A ring over `shape.bytes()` bytes at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be valid for reads and writes of `shape.bytes()` bytes,
    /// aligned to 16, for as long as the ring lives; nothing but the kernel
    /// (following `TPACKET_V2`'s status protocol) and this ring may write it.
    pub unsafe fn new(base: NonNull<u8>, shape: RingShape) -> RxRing {
        RxRing {
            base,
            shape,
            head: 0,
            taken: 0,
            spans: [(0, 0); BATCH],
            malformed: 0,
            truncated: 0,
        }
    }

    /// The status word of slot `index`.
    fn status(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index < self.shape.frames);
        // SAFETY: the slot lies inside the mapping (`index < frames`), its
        // start is 16-aligned (the mapping is, and slots are a power of two
        // of at least 128 bytes), and the kernel reads and writes this word
        // with atomic accesses of the same size: an `AtomicU32` over it is
        // the shared view both sides use.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(index * self.shape.frame_size).cast()) }
    }

    /// The bytes of slot `index`, which the device owns (its status said so
    /// and it has not been handed back).
    fn slot(&self, index: usize) -> &[u8] {
        // SAFETY: the slot lies inside the mapping; while its status says
        // the device owns it the kernel does not write it, and it is only
        // handed back (by `release`, which takes `&mut self`) once no slice
        // of it is borrowed.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(index * self.shape.frame_size),
                self.shape.frame_size,
            )
        }
    }

    /// Hands back the slots of the last batch, then takes up to [`BATCH`]
    /// slots the kernel has filled; returns how many (0: the ring is empty).
    pub fn receive(&mut self) -> usize {
        self.release();
        let mut n = 0;
        while n < BATCH && n < self.shape.frames {
            let index = (self.head + n) % self.shape.frames;
            let status = self.status(index).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            self.spans[n] = match parse_rx_slot(self.slot(index), status) {
                RxSlot::Frame { start, len } => (start, len),
                RxSlot::Outgoing => (0, 0),
                RxSlot::Truncated => {
                    self.truncated += 1;
                    (0, 0)
                }
                RxSlot::Malformed => {
                    self.malformed += 1;
                    (0, 0)
                }
            };
            n += 1;
        }
        self.taken = n;
        n
    }

    /// The frames of the slots the last [`RxRing::receive`] took.
    pub fn frames(&self) -> impl Iterator<Item = &[u8]> {
        self.spans[..self.taken]
            .iter()
            .enumerate()
            .filter(|(_, (_, len))| *len > 0)
            .map(|(i, (start, len))| {
                let index = (self.head + i) % self.shape.frames;
                &self.slot(index)[*start..*start + *len]
            })
    }

    /// Gives the slots taken back to the kernel.
    fn release(&mut self) {
        for i in 0..self.taken {
            let index = (self.head + i) % self.shape.frames;
            self.status(index)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
        self.head = (self.head + self.taken) % self.shape.frames;
        self.taken = 0;
    }
}

/// The transmit ring: slots filled in order and handed to the kernel in
/// batches.
#[derive(Debug)]
pub struct TxRing {
    base: NonNull<u8>,
    shape: RingShape,
    fd: RawFd,
    /// The first slot filled and not yet marked for sending.
    head: usize,
    /// Slots filled from `head`, not yet marked.
    filled: usize,
    /// Frames marked that the kernel has not been told about.
    unsent: bool,
    /// Frames not sent: longer than a slot, or the ring full.
    pub dropped: u64,
}

impl TxRing {
    /// A ring over `shape.bytes()` bytes at `base`, sent on socket `fd`.
    ///
    /// # Safety
    ///
    /// As for [`RxRing::new`]; `fd` is the socket the ring belongs to and
    /// stays open while the ring lives.
    pub unsafe fn new(base: NonNull<u8>, shape: RingShape, fd: RawFd) -> TxRing {
        TxRing {
            base,
            shape,
            fd,
            head: 0,
            filled: 0,
            unsent: false,
            dropped: 0,
        }
    }

    fn status(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index < self.shape.frames);
        // SAFETY: as in `RxRing::status`: inside the mapping, 16-aligned,
        // and shared with the kernel through atomic accesses.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(index * self.shape.frame_size).cast()) }
    }

    /// The largest frame a slot takes.
    pub fn frame_cap(&self) -> usize {
        self.shape.frame_size - TX_DATA_OFFSET
    }

    /// A slot for a frame of `len` bytes to be filled; it is marked for
    /// sending at the next [`TxRing::flush`] (or the next slot taken after
    /// the ring filled up). `None` when `len` exceeds a slot or every slot
    /// is still the kernel's: the frame is then not sent (counted).
    pub fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.frame_cap() {
            self.dropped += 1;
            return None;
        }
        if self.filled == self.shape.frames {
            self.flush();
        }
        let index = (self.head + self.filled) % self.shape.frames;
        if self.status(index).load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
            // The kernel still holds it: tell it about what waits, then
            // give up on this frame as a congested wire would.
            self.flush();
            if self.status(index).load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
                self.dropped += 1;
                return None;
            }
        }
        let at = index * self.shape.frame_size;
        // SAFETY: the slot lies inside the mapping and is the device's (its
        // status is AVAILABLE and it is marked for sending only by `flush`,
        // which takes `&mut self` after this borrow ended). `tp_len` is the
        // second 32-bit word of the header; the frame area starts at
        // TX_DATA_OFFSET and `len` fits in the slot (checked above).
        unsafe {
            let slot = self.base.as_ptr().add(at);
            slot.add(4).cast::<u32>().write_volatile(len as u32);
            self.filled += 1;
            Some(std::slice::from_raw_parts_mut(
                slot.add(TX_DATA_OFFSET),
                len,
            ))
        }
    }

    /// Marks every filled slot for sending and tells the kernel (one
    /// system call); returns how many frames were marked.
    pub fn flush(&mut self) -> usize {
        let marked = self.filled;
        for i in 0..self.filled {
            let index = (self.head + i) % self.shape.frames;
            self.status(index)
                .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        }
        self.head = (self.head + self.filled) % self.shape.frames;
        self.filled = 0;
        self.unsent |= marked > 0;
        if self.unsent {
            // SAFETY: a send with no data on a socket with a transmit ring
            // only makes the kernel walk the ring; no user memory is passed.
            let rc = unsafe { libc::send(self.fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) };
            // On EAGAIN or ENOBUFS the marked slots stay marked and go with
            // the next call.
            self.unsent = rc < 0;
        }
        marked
    }

    /// Whether frames wait to be marked or sent.
    pub fn is_empty(&self) -> bool {
        self.filled == 0 && !self.unsent
    }
}

// SAFETY: as above; the pointers are only used by the ring's owner.
unsafe impl Send for RxRing {}
// SAFETY: as above.
unsafe impl Send for TxRing {}

/// A packet socket with its receive and transmit rings.
#[derive(Debug)]
pub struct PacketRing {
    /// The receive ring.
    pub rx: RxRing,
    /// The transmit ring.
    pub tx: TxRing,
    /// The shape of each ring.
    pub shape: RingShape,
    _mapping: Mapping,
    socket: PacketSocket,
}

fn set_int(fd: RawFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            option,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Which step of setting the rings up failed.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// A socket option the rings need was refused.
    #[error("setsockopt {option} refused")]
    Option {
        /// The option.
        option: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The rings could not be mapped.
    #[error("mmap of {bytes} bytes of rings failed")]
    Map {
        /// The size asked for.
        bytes: usize,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl PacketRing {
    /// Sets up a receive and a transmit ring of `frames` slots each, big
    /// enough for frames of `frame_cap` bytes, on `socket` (already bound,
    /// with its filter), and maps them.
    pub fn open(socket: PacketSocket, frame_cap: usize, frames: usize) -> Result<Self, RingError> {
        let fd = socket.as_raw_fd();
        let option = |option, source| RingError::Option { option, source };
        set_int(fd, libc::PACKET_VERSION, TPACKET_V2)
            .map_err(|e| option("PACKET_VERSION (TPACKET_V2)", e))?;
        // A frame the kernel cannot take is skipped, not left blocking the ring.
        set_int(fd, libc::PACKET_LOSS, 1).map_err(|e| option("PACKET_LOSS", e))?;
        if let Err(e) = set_int(fd, libc::PACKET_QDISC_BYPASS, 1) {
            // Older kernels: frames go through the queueing discipline.
            tracing::debug!("PACKET_QDISC_BYPASS: {e}");
        }
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let shape = RingShape::new(frame_cap, frames, page);
        let request = shape.request();
        for (name, ring) in [
            ("PACKET_RX_RING", libc::PACKET_RX_RING),
            ("PACKET_TX_RING", libc::PACKET_TX_RING),
        ] {
            // SAFETY: the option value is a live tpacket_req of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    ring,
                    (&raw const request).cast(),
                    size_of::<libc::tpacket_req>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(option(name, io::Error::last_os_error()));
            }
        }
        // The socket's rings, receive first, then transmit, as the kernel
        // lays them out.
        let bytes = 2 * shape.bytes();
        let mapping =
            Mapping::new(bytes, Some(fd), 0).map_err(|source| RingError::Map { bytes, source })?;
        let base = mapping.base();
        // SAFETY: `base` is page-aligned and valid for `bytes` bytes until
        // `mapping` drops, which happens with the rings; the kernel writes
        // it only as TPACKET_V2 says.
        let rx = unsafe { RxRing::new(base, shape) };
        // SAFETY: the transmit ring is the second half of the mapping; the
        // socket lives as long as the ring (same struct).
        let tx = unsafe { TxRing::new(base.add(shape.bytes()), shape, fd) };
        Ok(PacketRing {
            rx,
            tx,
            shape,
            _mapping: mapping,
            socket,
        })
    }

    /// The socket, for its statistics.
    pub fn socket(&mut self) -> &mut PacketSocket {
        &mut self.socket
    }

    /// The socket's descriptor, to register with the event loop.
    pub fn socket_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: usize = 256;

    /// A ring's memory built by hand, 16-aligned; every access goes
    /// through one pointer, as the kernel's and the ring's do.
    struct Memory {
        _words: Vec<u128>,
        base: NonNull<u8>,
        len: usize,
    }

    impl Memory {
        fn new(shape: RingShape) -> Self {
            let mut words = vec![0u128; shape.bytes() / 16];
            let base = NonNull::new(words.as_mut_ptr().cast()).expect("non-null");
            Memory {
                _words: words,
                base,
                len: shape.bytes(),
            }
        }
        fn base(&mut self) -> NonNull<u8> {
            self.base
        }
        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the vector's own bytes, alive as long as `self`; no
            // other slice of them is live while this one is.
            unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
        }
        /// Fills slot `i` as the kernel would: a frame of `data` at `mac`.
        fn put(&mut self, i: usize, status: u32, mac: u16, len: u32, snaplen: u32, data: &[u8]) {
            let slot = &mut self.bytes()[i * FRAME..(i + 1) * FRAME];
            slot[0..4].copy_from_slice(&status.to_ne_bytes());
            slot[4..8].copy_from_slice(&len.to_ne_bytes());
            slot[8..12].copy_from_slice(&snaplen.to_ne_bytes());
            slot[12..14].copy_from_slice(&mac.to_ne_bytes());
            slot[PKTTYPE_AT] = libc::PACKET_HOST;
            let at = usize::from(mac);
            let end = (at + data.len()).min(FRAME);
            if at < FRAME {
                slot[at..end].copy_from_slice(&data[..end - at]);
            }
        }
        fn status(&mut self, i: usize) -> u32 {
            u32::from_ne_bytes(
                self.bytes()[i * FRAME..i * FRAME + 4]
                    .try_into()
                    .expect("4"),
            )
        }
    }

    fn shape(frames: usize) -> RingShape {
        RingShape {
            frame_size: FRAME,
            frames,
            block_size: FRAME,
        }
    }

    fn frame(tag: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn the_walk_hands_out_filled_slots_in_order_and_gives_them_back() {
        let shape = shape(4);
        let mut mem = Memory::new(shape);
        // SAFETY: `mem` outlives the ring and is only written through it.
        let mut ring = unsafe { RxRing::new(mem.base(), shape) };
        let user = libc::TP_STATUS_USER;
        mem.put(0, user, 66, 60, 60, &frame(1, 60));
        mem.put(1, user, 66, 42, 42, &frame(2, 42));
        assert_eq!(ring.receive(), 2);
        let got: Vec<Vec<u8>> = ring.frames().map(<[u8]>::to_vec).collect();
        assert_eq!(got, [frame(1, 60), frame(2, 42)]);
        // Nothing more: the two slots go back to the kernel.
        assert_eq!(ring.receive(), 0);
        assert_eq!((mem.status(0), mem.status(1)), (0, 0));
        // The walk goes on from slot 2 and wraps to slot 0.
        mem.put(2, user, 80, 20, 20, &frame(3, 20));
        mem.put(3, user, 80, 20, 20, &frame(4, 20));
        mem.put(0, user, 80, 20, 20, &frame(5, 20));
        assert_eq!(ring.receive(), 3);
        let got: Vec<Vec<u8>> = ring.frames().map(<[u8]>::to_vec).collect();
        assert_eq!(got, [frame(3, 20), frame(4, 20), frame(5, 20)]);
        assert_eq!(ring.receive(), 0);
        assert_eq!((ring.malformed, ring.truncated), (0, 0));
    }

    #[test]
    fn bad_descriptors_are_counted_and_skipped_without_reading_outside_the_slot() {
        let shape = shape(8);
        let mut mem = Memory::new(shape);
        // SAFETY: `mem` outlives the ring and is only written through it.
        let mut ring = unsafe { RxRing::new(mem.base(), shape) };
        let user = libc::TP_STATUS_USER;
        let data = frame(9, 60);
        mem.put(0, user, 66, 60, 1000, &data); // snaplen past the slot
        mem.put(1, user, 4000, 60, 60, &data); // mac offset past the slot
        mem.put(2, user, 8, 60, 60, &data); // mac inside the header
        mem.put(3, user, 66, 10, 10, &data); // shorter than Ethernet
        mem.put(4, user, 66, 60, u32::MAX, &data); // overflowing length
        mem.put(5, user | libc::TP_STATUS_COPY, 66, 9000, 190, &data); // cut short
        mem.put(6, user, 66, 9000, 60, &data); // snaplen below len: cut short
        mem.put(7, user, 66, 60, 60, &data); // a good one after them
        assert_eq!(ring.receive(), 8);
        let got: Vec<Vec<u8>> = ring.frames().map(<[u8]>::to_vec).collect();
        assert_eq!(got, [data]);
        assert_eq!((ring.malformed, ring.truncated), (5, 2));
        assert_eq!(ring.receive(), 0);
        assert!((0..8).all(|i| mem.status(i) == 0), "all handed back");
    }

    #[test]
    fn frames_this_host_sent_are_skipped() {
        let mut slot = vec![0u8; FRAME];
        slot[4..8].copy_from_slice(&60u32.to_ne_bytes());
        slot[8..12].copy_from_slice(&60u32.to_ne_bytes());
        slot[12..14].copy_from_slice(&66u16.to_ne_bytes());
        assert_eq!(
            parse_rx_slot(&slot, libc::TP_STATUS_USER),
            RxSlot::Frame { start: 66, len: 60 }
        );
        slot[PKTTYPE_AT] = libc::PACKET_OUTGOING;
        assert_eq!(parse_rx_slot(&slot, libc::TP_STATUS_USER), RxSlot::Outgoing);
        // A slot too short for its own header.
        assert_eq!(parse_rx_slot(&slot[..10], 1), RxSlot::Malformed);
    }

    #[test]
    fn a_full_batch_stops_the_walk_and_the_rest_comes_next() {
        let shape = shape(BATCH + 4);
        let mut mem = Memory::new(shape);
        // SAFETY: `mem` outlives the ring and is only written through it.
        let mut ring = unsafe { RxRing::new(mem.base(), shape) };
        for i in 0..BATCH + 2 {
            mem.put(i, libc::TP_STATUS_USER, 66, 20, 20, &frame(i as u8, 20));
        }
        assert_eq!(ring.receive(), BATCH);
        assert_eq!(ring.frames().count(), BATCH);
        assert_eq!(ring.receive(), 2);
        let got: Vec<Vec<u8>> = ring.frames().map(<[u8]>::to_vec).collect();
        assert_eq!(got, [frame(BATCH as u8, 20), frame(BATCH as u8 + 1, 20)]);
    }

    #[test]
    fn shapes_fit_the_frame_and_whole_blocks() {
        let s = RingShape::new(1518, 1000, 4096);
        assert_eq!((s.frame_size, s.block_size, s.frames), (2048, 4096, 1000));
        let s = RingShape::new(1518, 1001, 4096);
        assert_eq!(s.frames, 1002, "two slots per block");
        let s = RingShape::new(9018, 5, 4096);
        assert_eq!((s.frame_size, s.block_size, s.frames), (16384, 16384, 16));
        assert!(RingShape::new(1518, usize::MAX, 4096).frames <= MAX_RING_FRAMES);
        let r = s.request();
        assert_eq!(
            r.tp_block_nr * r.tp_block_size,
            r.tp_frame_nr * r.tp_frame_size
        );
    }

    #[test]
    fn the_transmit_ring_refuses_oversized_frames_and_slots_the_kernel_holds() {
        let shape = shape(2);
        let mut mem = Memory::new(shape);
        // SAFETY: `mem` outlives the ring; fd -1 makes the kick a failed
        // send, which leaves the slots marked, as EAGAIN would.
        let mut ring = unsafe { TxRing::new(mem.base(), shape, -1) };
        assert!(ring.slot(FRAME).is_none());
        assert_eq!(ring.dropped, 1);
        ring.slot(60).expect("slot 0").fill(0xAB);
        assert_eq!(ring.flush(), 1);
        assert_eq!(mem.status(0), libc::TP_STATUS_SEND_REQUEST);
        assert_eq!(&mem.bytes()[4..8], &60u32.to_ne_bytes());
        assert_eq!(mem.bytes()[TX_DATA_OFFSET], 0xAB);
        assert!(!ring.is_empty(), "not sent yet");
        ring.slot(60).expect("slot 1");
        // Slot 0 is still the kernel's: the next frame is dropped.
        assert!(ring.slot(60).is_none());
        assert_eq!(ring.dropped, 2);
    }
}
