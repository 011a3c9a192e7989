//! How a RoCEv2 port moves its frames: through `PACKET_MMAP` rings shared
//! with the kernel, or with `recvmmsg`/`sendmmsg` on the packet socket.
//!
//! The rings are the default; where the kernel refuses them the port falls
//! back to the socket calls and says why. Both paths see the same frames
//! (the same socket, filter and outgoing-frame rule), so everything above
//! [`Wire`] is the same code.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::str::FromStr;

use super::packet::{PacketSocket, RxBatch, TxBatch};
pub use super::packet_ring::DEFAULT_RING_FRAMES;
use super::packet_ring::{PacketRing, RingError};

/// A RoCEv2 port's frame path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoceIo {
    /// `TPACKET_V2` receive and transmit rings mapped into the device.
    PacketRing,
    /// `recvmmsg` and `sendmmsg`, up to 64 frames per call.
    Socket,
}

impl RoceIo {
    /// The name used on the command line, in logs and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RoceIo::PacketRing => "packet-ring",
            RoceIo::Socket => "socket",
        }
    }
}

impl fmt::Display for RoceIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown frame-path name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown RoCE frame path {0:?}: use `packet-ring` (PACKET_MMAP rings) or `socket`")]
pub struct UnknownRoceIo(pub String);

impl FromStr for RoceIo {
    type Err = UnknownRoceIo;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "packet-ring" | "packet_ring" | "ring" | "tpacket" => Ok(RoceIo::PacketRing),
            "socket" => Ok(RoceIo::Socket),
            _ => Err(UnknownRoceIo(s.to_owned())),
        }
    }
}

/// What the operator asked for, for every RoCEv2 port of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceIoConfig {
    /// The frame path wanted; the rings fall back to the socket calls
    /// where the kernel refuses them.
    pub path: RoceIo,
    /// Slots of each ring (receive and transmit), each a power of two of
    /// bytes big enough for one frame of the interface's MTU: 2 KiB at MTU
    /// 1500, so the default 1024 takes 4 MiB per port.
    pub ring_frames: usize,
}

impl Default for RoceIoConfig {
    fn default() -> Self {
        RoceIoConfig {
            path: RoceIo::PacketRing,
            ring_frames: DEFAULT_RING_FRAMES,
        }
    }
}

/// The port's socket with the path its frames take.
#[derive(Debug)]
pub enum Wire {
    /// System calls on the socket, batched.
    Socket {
        /// The socket.
        socket: PacketSocket,
        /// Received frames.
        rx: Box<RxBatch>,
        /// Frames to send.
        tx: Box<TxBatch>,
    },
    /// Rings shared with the kernel.
    Ring(Box<PacketRing>),
}

/// Where a frame to send is written.
pub trait FrameSink {
    /// Room for a frame of `len` bytes, sent at the next flush; `None`
    /// when it cannot be sent (too long, or no room: counted as dropped).
    fn slot(&mut self, len: usize) -> Option<&mut [u8]>;
}

/// The socket path's sink: its batch, flushed on the socket when full.
struct SocketSink<'a> {
    socket: &'a PacketSocket,
    tx: &'a mut TxBatch,
}

impl FrameSink for SocketSink<'_> {
    fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        self.tx.slot(self.socket, len)
    }
}

impl FrameSink for super::packet_ring::TxRing {
    fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        super::packet_ring::TxRing::slot(self, len)
    }
}

/// Why the rings were asked for and the socket calls run.
#[derive(Debug)]
pub struct RingFallback(pub RingError);

impl Wire {
    /// Opens the frame path `config` asks for on `socket` (bound, with its
    /// filter), for frames of up to `frame_cap` bytes; the rings fall back
    /// to the socket calls when the kernel refuses them (the reason is
    /// returned with the path).
    pub fn open(
        socket: PacketSocket,
        frame_cap: usize,
        config: &RoceIoConfig,
        reopen: impl FnOnce() -> io::Result<PacketSocket>,
    ) -> io::Result<(Wire, Option<RingFallback>)> {
        let socket_path = |socket| Wire::Socket {
            socket,
            rx: Box::new(RxBatch::new(frame_cap)),
            tx: Box::new(TxBatch::new(frame_cap)),
        };
        match config.path {
            RoceIo::Socket => Ok((socket_path(socket), None)),
            RoceIo::PacketRing => match PacketRing::open(socket, frame_cap, config.ring_frames) {
                Ok(ring) => Ok((Wire::Ring(Box::new(ring)), None)),
                // The failed set-up may have left the socket half
                // configured (its version changed): start afresh.
                Err(e) => Ok((socket_path(reopen()?), Some(RingFallback(e)))),
            },
        }
    }

    /// The path in use.
    pub fn path(&self) -> RoceIo {
        match self {
            Wire::Socket { .. } => RoceIo::Socket,
            Wire::Ring(_) => RoceIo::PacketRing,
        }
    }

    /// The path in words, with the rings' size, for the start-up line.
    pub fn describe(&self) -> String {
        match self {
            Wire::Socket { .. } => "socket (recvmmsg/sendmmsg)".to_owned(),
            Wire::Ring(ring) => format!(
                "packet-ring (TPACKET_V2: receive and transmit rings of {} slots of {} B, \
                 {} KiB mapped)",
                ring.shape.frames,
                ring.shape.frame_size,
                2 * ring.shape.bytes() / 1024
            ),
        }
    }

    /// Hands every frame waiting to `each`, with a sink for frames sent in
    /// answer, until none is left; then sends what was queued. Returns how
    /// many frames went out.
    pub fn drain(&mut self, mut each: impl FnMut(&[u8], &mut dyn FrameSink)) -> io::Result<u64> {
        match self {
            Wire::Socket { socket, rx, tx } => {
                let mut failed = None;
                loop {
                    match rx.receive(socket) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                    let mut sink = SocketSink { socket, tx };
                    for frame in rx.frames() {
                        each(frame, &mut sink);
                    }
                }
                let sent = if tx.is_empty() { 0 } else { tx.flush(socket) };
                failed.map_or(Ok(sent as u64), Err)
            }
            Wire::Ring(ring) => {
                let PacketRing { rx, tx, .. } = &mut **ring;
                while rx.receive() > 0 {
                    for frame in rx.frames() {
                        each(frame, &mut *tx);
                    }
                }
                Ok(if tx.is_empty() { 0 } else { tx.flush() as u64 })
            }
        }
    }

    /// Room for one frame to send (see [`FrameSink::slot`]).
    pub fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        match self {
            Wire::Socket { socket, tx, .. } => tx.slot(socket, len),
            Wire::Ring(ring) => ring.tx.slot(len),
        }
    }

    /// Sends what is queued; returns how many frames went out.
    pub fn flush(&mut self) -> u64 {
        match self {
            Wire::Socket { socket, tx, .. } if !tx.is_empty() => tx.flush(socket) as u64,
            Wire::Ring(ring) if !ring.tx.is_empty() => ring.tx.flush() as u64,
            _ => 0,
        }
    }

    /// Frames dropped: by the kernel for want of room on receive, or not
    /// sent (queue or ring full, too long).
    pub fn overflow(&mut self) -> u64 {
        match self {
            Wire::Socket { socket, tx, .. } => socket.drops() + tx.dropped,
            Wire::Ring(ring) => {
                let dropped = ring.tx.dropped;
                ring.socket().drops() + dropped
            }
        }
    }

    /// Slots of the receive ring whose header was out of bounds, and
    /// frames longer than a slot (both 0 on the socket path, where the
    /// kernel copies into buffers of the device's own).
    pub fn ring_faults(&self) -> (u64, u64) {
        match self {
            Wire::Socket { .. } => (0, 0),
            Wire::Ring(ring) => (ring.rx.malformed, ring.rx.truncated),
        }
    }
}

impl AsRawFd for Wire {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Wire::Socket { socket, .. } => socket.as_raw_fd(),
            Wire::Ring(ring) => ring.socket_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::packet::{interface_info, roce_filter};
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    /// An address on loopback nothing else uses, for frames the tests send
    /// to themselves.
    const TEST_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 77);

    /// A packet socket on loopback that receives ARP and RoCEv2 to
    /// [`TEST_IP`] (needs root, as the RoCE tests do).
    fn loopback_socket() -> PacketSocket {
        let lo = interface_info("lo").expect("loopback");
        PacketSocket::open(lo.index, &roce_filter(TEST_IP)).expect("packet socket (root needed)")
    }

    /// An Ethernet + IPv4 + UDP frame to [`TEST_IP`] port 4791 on loopback
    /// (zero MAC addresses), with `payload`.
    fn roce_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1]);
        f.extend_from_slice(&TEST_IP.octets());
        f.extend_from_slice(&0xC000u16.to_be_bytes());
        f.extend_from_slice(&4791u16.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_frame_sent_through_the_transmit_ring_comes_back_through_the_receive_ring() {
        let config = RoceIoConfig {
            path: RoceIo::PacketRing,
            ring_frames: 16,
        };
        let (mut wire, fallback) =
            Wire::open(loopback_socket(), 1518, &config, || Ok(loopback_socket())).expect("open");
        assert!(fallback.is_none(), "{fallback:?}");
        assert_eq!(wire.path(), RoceIo::PacketRing);
        let frames: Vec<Vec<u8>> = (0..3u8).map(|i| roce_frame(&[i; 40])).collect();
        for frame in &frames {
            wire.slot(frame.len())
                .expect("a free slot")
                .copy_from_slice(frame);
        }
        assert_eq!(wire.flush(), 3);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < frames.len() && Instant::now() < deadline {
            wire.drain(|frame, _| got.push(frame.to_vec()))
                .expect("drain");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, frames);
        assert_eq!(wire.ring_faults(), (0, 0));
    }

    #[test]
    fn a_socket_the_kernel_refuses_rings_on_falls_back_to_socket_calls() {
        // A socket that already has a receive ring: the kernel refuses to
        // change its version (EBUSY), as it refuses rings where they are
        // not allowed.
        let socket = loopback_socket();
        let req = libc::tpacket_req {
            tp_block_size: 4096,
            tp_block_nr: 1,
            tp_frame_size: 2048,
            tp_frame_nr: 2,
        };
        // SAFETY: the option value is a live tpacket_req of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_RX_RING,
                (&raw const req).cast(),
                size_of::<libc::tpacket_req>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        let (wire, fallback) = Wire::open(socket, 1518, &RoceIoConfig::default(), || {
            Ok(loopback_socket())
        })
        .expect("open");
        assert_eq!(wire.path(), RoceIo::Socket);
        let why = super::super::error_chain(&fallback.expect("a fallback").0);
        assert!(why.contains("PACKET_VERSION"), "{why}");
    }

    #[test]
    fn names_parse_both_ways() {
        for name in ["packet-ring", "PACKET_RING", " ring ", "tpacket"] {
            assert_eq!(name.parse(), Ok(RoceIo::PacketRing), "{name}");
        }
        assert_eq!("socket".parse(), Ok(RoceIo::Socket));
        assert!("xdp".parse::<RoceIo>().is_err());
        for path in [RoceIo::PacketRing, RoceIo::Socket] {
            assert_eq!(path.as_str().parse(), Ok(path));
        }
    }
}
