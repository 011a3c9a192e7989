//! How a RoCEv2 port moves its frames: through an `AF_XDP` socket fed by
//! an XDP program, through `PACKET_MMAP` rings shared with the kernel, or
//! with `recvmmsg`/`sendmmsg` on the packet socket.
//!
//! `AF_XDP` is the default; where the kernel refuses it the port falls
//! back to the rings, and where it refuses those to the socket calls, and
//! says why. Every path hands on the same frames (the same filter rule,
//! no outgoing frames), so everything above [`Wire`] is the same code.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::str::FromStr;

use super::packet::{PacketSocket, RxBatch, TxBatch};
pub use super::packet_ring::DEFAULT_RING_FRAMES;
use super::packet_ring::PacketRing;
use super::xdp::{XdpWire, XskSender};

/// A RoCEv2 port's frame path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoceIo {
    /// An `AF_XDP` socket's rings, fed by an XDP program on the interface.
    Xdp,
    /// `TPACKET_V2` receive and transmit rings mapped into the device.
    PacketRing,
    /// `recvmmsg` and `sendmmsg`, up to 64 frames per call.
    Socket,
}

impl RoceIo {
    /// The name used on the command line, in logs and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RoceIo::Xdp => "xdp",
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
#[error(
    "unknown RoCE frame path {0:?}: use `xdp` (AF_XDP), `packet-ring` (PACKET_MMAP rings) or `socket`"
)]
pub struct UnknownRoceIo(pub String);

impl FromStr for RoceIo {
    type Err = UnknownRoceIo;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "xdp" | "af-xdp" | "af_xdp" => Ok(RoceIo::Xdp),
            "packet-ring" | "packet_ring" | "ring" | "tpacket" => Ok(RoceIo::PacketRing),
            "socket" => Ok(RoceIo::Socket),
            _ => Err(UnknownRoceIo(s.to_owned())),
        }
    }
}

/// What the operator asked for, for every RoCEv2 port of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceIoConfig {
    /// The frame path wanted; each falls back to the next (`xdp`, then
    /// `packet-ring`, then `socket`) where the kernel refuses it.
    pub path: RoceIo,
    /// Slots of each ring (receive and transmit), each a power of two of
    /// bytes big enough for one frame of the interface's MTU: 2 KiB at MTU
    /// 1500, so the default 1024 takes 4 MiB per port (on `xdp`, a UMEM
    /// of that many chunks per direction).
    pub ring_frames: usize,
}

impl Default for RoceIoConfig {
    fn default() -> Self {
        RoceIoConfig {
            path: RoceIo::Xdp,
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
    /// An `AF_XDP` socket, with the packet socket for what it passes on.
    Xdp(Box<XdpWire>),
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

impl FrameSink for XskSender<'_> {
    fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        XskSender::slot(self, len)
    }
}

/// A frame path asked for that the kernel refused, and why.
#[derive(Debug)]
pub struct PathFallback {
    /// The path asked for.
    pub asked: RoceIo,
    /// Why it cannot run.
    pub why: Box<dyn std::error::Error + Send + Sync>,
}

/// Where a port's frames arrive and leave: its interface and address.
#[derive(Debug, Clone, Copy)]
pub struct PortAddress {
    /// The interface's index.
    pub ifindex: u32,
    /// The port's IPv4 address.
    pub ip: Ipv4Addr,
}

impl Wire {
    /// Opens the frame path `config` asks for on `socket` (bound to the
    /// port's interface, with its filter), for frames of up to `frame_cap`
    /// bytes; a path the kernel refuses falls back to the next, and the
    /// first refusal is returned with the path that runs.
    pub fn open(
        socket: PacketSocket,
        port: PortAddress,
        frame_cap: usize,
        config: &RoceIoConfig,
        reopen: impl Fn() -> io::Result<PacketSocket>,
    ) -> io::Result<(Wire, Option<PathFallback>)> {
        let socket_path = |socket| Wire::Socket {
            socket,
            rx: Box::new(RxBatch::new(frame_cap)),
            tx: Box::new(TxBatch::new(frame_cap)),
        };
        let mut socket = socket;
        let mut fallback = None;
        if config.path == RoceIo::Xdp {
            match XdpWire::open(socket, port.ifindex, port.ip, frame_cap, config.ring_frames) {
                Ok(xdp) => return Ok((Wire::Xdp(Box::new(xdp)), None)),
                Err(e) => {
                    fallback = Some(PathFallback {
                        asked: RoceIo::Xdp,
                        why: Box::new(e),
                    });
                    socket = reopen()?;
                }
            }
        }
        if config.path == RoceIo::Socket {
            return Ok((socket_path(socket), None));
        }
        match PacketRing::open(socket, frame_cap, config.ring_frames) {
            Ok(ring) => Ok((Wire::Ring(Box::new(ring)), fallback)),
            // The failed set-up may have left the socket half configured
            // (its version changed): start afresh.
            Err(e) => Ok((
                socket_path(reopen()?),
                fallback.or(Some(PathFallback {
                    asked: RoceIo::PacketRing,
                    why: Box::new(e),
                })),
            )),
        }
    }

    /// The path in use.
    pub fn path(&self) -> RoceIo {
        match self {
            Wire::Socket { .. } => RoceIo::Socket,
            Wire::Ring(_) => RoceIo::PacketRing,
            Wire::Xdp(_) => RoceIo::Xdp,
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
            Wire::Xdp(xdp) => xdp.describe(),
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
            Wire::Xdp(xdp) => xdp.drain(|frame, sender| each(frame, sender)),
        }
    }

    /// Room for one frame to send (see [`FrameSink::slot`]).
    pub fn slot(&mut self, len: usize) -> Option<&mut [u8]> {
        match self {
            Wire::Socket { socket, tx, .. } => tx.slot(socket, len),
            Wire::Ring(ring) => ring.tx.slot(len),
            Wire::Xdp(xdp) => xdp.slot(len),
        }
    }

    /// Sends what is queued; returns how many frames went out.
    pub fn flush(&mut self) -> u64 {
        match self {
            Wire::Socket { socket, tx, .. } if !tx.is_empty() => tx.flush(socket) as u64,
            Wire::Ring(ring) if !ring.tx.is_empty() => ring.tx.flush() as u64,
            Wire::Xdp(xdp) => xdp.flush(),
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
            Wire::Xdp(xdp) => xdp.overflow(),
        }
    }

    /// Receive slots or descriptors that pointed out of bounds, and frames
    /// longer than a slot (both 0 on the socket path, where the kernel
    /// copies into buffers of the device's own).
    pub fn ring_faults(&self) -> (u64, u64) {
        match self {
            Wire::Socket { .. } => (0, 0),
            Wire::Ring(ring) => (ring.rx.malformed, ring.rx.truncated),
            Wire::Xdp(xdp) => (xdp.malformed(), 0),
        }
    }

    /// On the `AF_XDP` path, frames received through its socket and
    /// through the packet socket.
    pub fn xdp_received(&self) -> Option<(u64, u64)> {
        match self {
            Wire::Xdp(xdp) => Some(xdp.received()),
            _ => None,
        }
    }

    /// The descriptors the event loop waits on (readable).
    pub fn sources(&self) -> Vec<RawFd> {
        match self {
            Wire::Socket { socket, .. } => vec![socket.as_raw_fd()],
            Wire::Ring(ring) => vec![ring.socket_fd()],
            Wire::Xdp(xdp) => xdp.sources().to_vec(),
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

    /// The port [`loopback_socket`] is for.
    fn loopback_port() -> PortAddress {
        PortAddress {
            ifindex: interface_info("lo").expect("loopback").index,
            ip: TEST_IP,
        }
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
            Wire::open(loopback_socket(), loopback_port(), 1518, &config, || {
                Ok(loopback_socket())
            })
            .expect("open");
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

    /// An Ethernet frame from `src` to `dst` of `ethertype` with `payload`.
    fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Frames that `drain` hands on until `want` arrived or 10 s passed.
    fn drain_until(wire: &mut Wire, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < want && Instant::now() < deadline {
            wire.drain(|frame, _| got.push(frame.to_vec()))
                .expect("drain");
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    /// A port on the host end of a veth runs on AF_XDP: RoCEv2 frames sent
    /// from the namespace arrive through its socket, ARP through the packet
    /// socket the program passes it to, and frames it sends reach the
    /// namespace. Dropping the wire detaches the program: frames to the
    /// port reach the kernel again.
    #[test]
    fn frames_cross_a_veth_both_ways_through_the_af_xdp_path() {
        let veth = testkit::netns::VethNamespace::create("pfxdp", "10.238.0")
            .expect("network namespace (root needed)");
        let (port_ip, peer_ip) = (veth.addr(1), veth.addr(2));
        let host = interface_info(&veth.host).expect("host end");
        let open = || PacketSocket::open(host.index, &roce_filter(port_ip));
        let config = RoceIoConfig {
            path: RoceIo::Xdp,
            ring_frames: 64,
        };
        let port = PortAddress {
            ifindex: host.index,
            ip: port_ip,
        };
        let (mut wire, fallback) =
            Wire::open(open().expect("packet socket"), port, 1518, &config, open).expect("open");
        if let Some(f) = &fallback {
            panic!(
                "{} refused: {}",
                f.asked,
                crate::driver::error_chain(&*f.why)
            );
        }
        assert_eq!(wire.path(), RoceIo::Xdp);
        assert_eq!(wire.sources().len(), 2);

        // The namespace's end: a socket-path wire for the peer's address,
        // on a thread of its own; it says its MAC, sends the frames it is
        // given and returns what reached it.
        let (mac_tx, mac_rx) = std::sync::mpsc::channel();
        let (frames_tx, frames_rx) = std::sync::mpsc::channel::<Vec<Vec<u8>>>();
        let veth = &veth;
        let reached_ns = std::thread::scope(|scope| {
            let peer_side = scope.spawn(move || {
                veth.enter_on_this_thread().expect("enter the namespace");
                let peer = interface_info(&veth.peer).expect("peer end");
                let open = || PacketSocket::open(peer.index, &roce_filter(peer_ip));
                let addr = PortAddress {
                    ifindex: peer.index,
                    ip: peer_ip,
                };
                let socket_path = RoceIoConfig {
                    path: RoceIo::Socket,
                    ring_frames: 16,
                };
                let (mut wire, _) =
                    Wire::open(open().expect("socket"), addr, 1518, &socket_path, open)
                        .expect("open");
                mac_tx.send(peer.mac).expect("main thread");
                for f in frames_rx.recv().expect("frames to send") {
                    wire.slot(f.len()).expect("room").copy_from_slice(&f);
                }
                wire.flush();
                drain_until(&mut wire, 1)
            });
            let peer_mac = mac_rx.recv().expect("the peer's MAC");
            let ipv4 = |src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr, fill: u8| {
                let mut p = roce_frame(&[fill; 40])[14..].to_vec();
                p[12..16].copy_from_slice(&src.octets());
                p[16..20].copy_from_slice(&dst.octets());
                p
            };
            let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
            arp.extend_from_slice(&peer_mac);
            arp.extend_from_slice(&peer_ip.octets());
            arp.extend_from_slice(&[0; 6]);
            arp.extend_from_slice(&port_ip.octets());
            let roce_in = [
                ethernet(host.mac, peer_mac, 0x0800, &ipv4(peer_ip, port_ip, 1)),
                ethernet(host.mac, peer_mac, 0x0800, &ipv4(peer_ip, port_ip, 2)),
            ];
            let arp_in = ethernet([0xff; 6], peer_mac, 0x0806, &arp);
            frames_tx
                .send(vec![roce_in[0].clone(), arp_in.clone(), roce_in[1].clone()])
                .expect("namespace side");
            let got = drain_until(&mut wire, 3);
            let is = |ethertype: [u8; 2]| {
                move |f: &&Vec<u8>| f.get(12..14) == Some(ethertype.as_slice())
            };
            let roce: Vec<_> = got.iter().filter(is([8, 0])).cloned().collect();
            let arp: Vec<_> = got.iter().filter(is([8, 6])).cloned().collect();
            assert_eq!(roce, roce_in, "RoCEv2 frames through the AF_XDP socket");
            assert_eq!(arp, [arp_in], "ARP through the packet socket");
            let answer = ethernet(peer_mac, host.mac, 0x0800, &ipv4(port_ip, peer_ip, 3));
            wire.slot(answer.len())
                .expect("room")
                .copy_from_slice(&answer);
            assert_eq!(wire.flush(), 1);
            let reached = peer_side.join().expect("namespace side");
            (reached, answer)
        });
        assert_eq!(
            reached_ns.0,
            [reached_ns.1],
            "the answer reached the namespace"
        );
        assert_eq!(
            wire.xdp_received(),
            Some((2, 1)),
            "RoCEv2 frames by the AF_XDP socket, ARP by the packet socket"
        );
        assert_eq!(wire.ring_faults(), (0, 0));
    }

    /// A second port on an interface whose queue already has an `AF_XDP`
    /// socket (and an XDP program) is refused by the kernel: it runs on the
    /// packet rings and says why AF_XDP could not run.
    #[test]
    fn a_port_the_kernel_refuses_af_xdp_on_falls_back_to_the_rings() {
        let veth = testkit::netns::VethNamespace::create("pfxdq", "10.238.1")
            .expect("network namespace (root needed)");
        let host = interface_info(&veth.host).expect("host end");
        let xdp = RoceIoConfig {
            path: RoceIo::Xdp,
            ring_frames: 16,
        };
        let open_for = |last: u8| {
            let ip = veth.addr(last);
            let open = move || PacketSocket::open(host.index, &roce_filter(ip));
            let port = PortAddress {
                ifindex: host.index,
                ip,
            };
            Wire::open(open().expect("packet socket"), port, 1518, &xdp, open).expect("open")
        };
        let (first, refused) = open_for(1);
        assert!(refused.is_none());
        assert_eq!(first.path(), RoceIo::Xdp);
        let (second, refused) = open_for(3);
        assert_eq!(second.path(), RoceIo::PacketRing);
        let refused = refused.expect("AF_XDP refused");
        assert_eq!(refused.asked, RoceIo::Xdp);
        let why = super::super::error_chain(&*refused.why);
        assert!(why.contains("AF_XDP socket"), "{why}");
        drop((first, second));
        // The first port's program and socket went with it (the kernel
        // frees a closed socket's queue a moment later): a new port gets
        // AF_XDP.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut again = open_for(4);
        while again.0.path() != RoceIo::Xdp && Instant::now() < deadline {
            drop(again);
            std::thread::sleep(Duration::from_millis(50));
            again = open_for(4);
        }
        assert_eq!(
            again.0.path(),
            RoceIo::Xdp,
            "{:?}",
            again.1.map(|f| super::super::error_chain(&*f.why))
        );
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
        let rings = RoceIoConfig {
            path: RoceIo::PacketRing,
            ..RoceIoConfig::default()
        };
        let (wire, fallback) = Wire::open(socket, loopback_port(), 1518, &rings, || {
            Ok(loopback_socket())
        })
        .expect("open");
        assert_eq!(wire.path(), RoceIo::Socket);
        let fallback = fallback.expect("a fallback");
        assert_eq!(fallback.asked, RoceIo::PacketRing);
        let why = super::super::error_chain(&*fallback.why);
        assert!(why.contains("PACKET_VERSION"), "{why}");
    }

    #[test]
    fn names_parse_both_ways() {
        for name in ["packet-ring", "PACKET_RING", " ring ", "tpacket"] {
            assert_eq!(name.parse(), Ok(RoceIo::PacketRing), "{name}");
        }
        assert_eq!("socket".parse(), Ok(RoceIo::Socket));
        for name in ["xdp", "AF_XDP", "af-xdp"] {
            assert_eq!(name.parse(), Ok(RoceIo::Xdp), "{name}");
        }
        assert!("dpdk".parse::<RoceIo>().is_err());
        for path in [RoceIo::Xdp, RoceIo::PacketRing, RoceIo::Socket] {
            assert_eq!(path.as_str().parse(), Ok(path));
        }
    }
}
