//! A RoCEv2 port's frame path on `AF_XDP`: an XDP program on the port's
//! interface hands its RoCEv2 frames to an `AF_XDP` socket whose rings the
//! event loop walks with no system call per frame, and every frame the
//! port sends goes out through that socket's transmit ring (one system
//! call per batch).
//!
//! Frames the program passes on (ARP, and RoCEv2 frames of a receive queue
//! the socket is not bound to) reach the kernel, where the port's packet
//! socket, with its filter, still receives them; the loop drains both.
//!
//! On veth, the lab's interfaces, the socket runs in copy mode: the kernel
//! copies each frame into the UMEM once, as the packet rings do; the gain
//! is in skipping the kernel's own receive path and the packet socket.
//!
//! The program is loaded and the socket set up with the system calls
//! themselves ([`program`], [`socket`]), with no C library: what is needed
//! is one map, twenty-three instructions and four rings, and the link
//! descriptor detaches the program when the device exits, even by SIGKILL.

mod program;
mod socket;

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};

pub use program::ProgramError;
use program::XdpProgram;
pub use socket::XskSender;
use socket::{XskError, XskShape, XskSocket};

use super::packet::{PacketSocket, RxBatch};

/// The receive queue the socket binds (veth has one unless made with more;
/// frames of other queues reach the packet socket).
const QUEUE: u32 = 0;

/// Why the `AF_XDP` path cannot run on a port.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// The XDP program or its map.
    #[error("XDP program")]
    Program(#[from] ProgramError),
    /// The `AF_XDP` socket.
    #[error("AF_XDP socket")]
    Socket(#[from] XskError),
    /// A frame of the interface's MTU does not fit a page.
    #[error("frames of {0} B do not fit an AF_XDP chunk")]
    FrameTooLong(usize),
}

/// The `AF_XDP` frame path of one port.
#[derive(Debug)]
pub struct XdpWire {
    xsk: XskSocket,
    program: XdpProgram,
    /// ARP and whatever the program passes on.
    socket: PacketSocket,
    rx: Box<RxBatch>,
    /// Frames received through the `AF_XDP` socket, and through the
    /// packet socket.
    received: (u64, u64),
}

impl XdpWire {
    /// Attaches the program to interface `ifindex` for frames to `ip` and
    /// opens the socket, `ring` entries per ring, for frames of up to
    /// `frame_cap` bytes; `socket` keeps receiving what the program passes.
    pub fn open(
        socket: PacketSocket,
        ifindex: u32,
        ip: Ipv4Addr,
        frame_cap: usize,
        ring: usize,
    ) -> Result<Self, XdpError> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let shape =
            XskShape::new(frame_cap, ring, page).ok_or(XdpError::FrameTooLong(frame_cap))?;
        let xsk = XskSocket::open(ifindex, QUEUE, shape)?;
        let program = XdpProgram::attach(ifindex, ip)?;
        program.insert(QUEUE, xsk.as_raw_fd())?;
        Ok(XdpWire {
            xsk,
            program,
            socket,
            rx: Box::new(RxBatch::new(frame_cap)),
            received: (0, 0),
        })
    }

    /// The path in words, for the start-up line.
    pub fn describe(&self) -> String {
        let shape = self.xsk.shape();
        format!(
            "xdp (AF_XDP copy mode on queue {QUEUE}, XDP program in {} mode; rings of {} \
             entries, UMEM of {} chunks of {} B, {} KiB; ARP through the packet socket)",
            self.program.mode().as_str(),
            shape.ring,
            2 * shape.ring,
            shape.chunk,
            shape.umem_bytes() / 1024
        )
    }

    /// Hands every frame waiting, on the socket's ring and then on the
    /// packet socket, to `each` with a sender for answers; the answers go
    /// out after each batch received (the transmit ring and its chunks
    /// hold one ring's worth). Returns how many frames went out.
    pub fn drain(&mut self, mut each: impl FnMut(&[u8], &mut XskSender<'_>)) -> io::Result<u64> {
        let mut sent = 0;
        loop {
            let n = self.xsk.receive(&mut each);
            if n == 0 {
                break;
            }
            self.received.0 += n as u64;
            sent += u64::from(self.xsk.flush());
        }
        let mut failed = None;
        loop {
            match self.rx.receive(&self.socket) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            for frame in self.rx.frames() {
                self.received.1 += 1;
                each(frame, &mut self.xsk.sender());
            }
        }
        sent += u64::from(self.xsk.flush());
        failed.map_or(Ok(sent), Err)
    }

    /// Room for one frame to send.
    pub fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        self.xsk.sender().slot(len)
    }

    /// Sends what is queued; returns how many frames went out.
    pub fn flush(&mut self) -> u64 {
        if self.xsk.has_pending() {
            u64::from(self.xsk.flush())
        } else {
            0
        }
    }

    /// Frames dropped: on receive by the kernel (either socket), or not
    /// sent.
    pub fn overflow(&mut self) -> u64 {
        let c = self.xsk.counters();
        c.rx_dropped + c.tx_dropped + self.socket.drops()
    }

    /// Descriptors the kernel gave outside their chunk.
    pub fn malformed(&self) -> u64 {
        self.xsk.counters().malformed
    }

    /// Frames received through the `AF_XDP` socket, and through the
    /// packet socket.
    pub fn received(&self) -> (u64, u64) {
        self.received
    }

    /// The descriptors the event loop waits on: the `AF_XDP` socket and
    /// the packet socket.
    pub fn sources(&self) -> [RawFd; 2] {
        [self.xsk.as_raw_fd(), self.socket.as_raw_fd()]
    }
}
