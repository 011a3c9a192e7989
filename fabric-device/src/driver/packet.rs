//! Raw Ethernet frames on one network interface, moved in batches.
//!
//! A [`PacketSocket`] is an `AF_PACKET` socket bound to the interface. A
//! classic BPF program attached to it ([`roce_filter`]) makes the kernel
//! drop every frame the RoCEv2 port does not want before it is queued, and
//! the socket ignores the frames the host itself sends. [`RxBatch`] reads
//! up to [`BATCH`] frames per `recvmmsg` call into buffers allocated once;
//! [`TxBatch`] gathers outgoing frames and writes them with one `sendmmsg`.
//! The socket is non-blocking and registers with mio directly, so the event
//! loop reads it without a thread or a copy in between.

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, Socket, Type};

/// Frames moved per system call.
pub const BATCH: usize = 64;
/// Bytes the kernel may queue for the socket before it drops frames.
const RECV_BUFFER: usize = 4 << 20;
/// `PACKET_IGNORE_OUTGOING` from `<linux/if_packet.h>` (Linux 4.20).
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// `PACKET_STATISTICS` from `<linux/if_packet.h>`.
const PACKET_STATISTICS: libc::c_int = 6;
/// `PACKET_OUTGOING`, the `sll_pkttype` of a frame this host sent.
const PACKET_OUTGOING: u8 = 4;
/// UDP port of RoCEv2.
const ROCE_PORT: u32 = 4791;

/// `struct tpacket_stats` from `<linux/if_packet.h>`.
#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    packets: libc::c_uint,
    drops: libc::c_uint,
}

/// One BPF instruction.
fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A BPF program that accepts ARP, and IPv4 datagrams to `ip` that are UDP
/// to port 4791 and not fragments; everything else is dropped in the
/// kernel.
pub fn roce_filter(ip: Ipv4Addr) -> Vec<libc::sock_filter> {
    const LDH_ABS: u16 = 0x28; // A = u16 at k
    const LD_ABS: u16 = 0x20; // A = u32 at k
    const LDB_ABS: u16 = 0x30; // A = u8 at k
    const LDH_IND: u16 = 0x48; // A = u16 at X + k
    const LDXB_MSH: u16 = 0xb1; // X = 4 * (u8 at k & 0xf)
    const JEQ: u16 = 0x15; // A == k ? jt : jf
    const JSET: u16 = 0x45; // A & k ? jt : jf
    const RET: u16 = 0x06; // accept k bytes
    // Jump offsets count from the next instruction: ACCEPT is 12, DROP 13.
    vec![
        op(LDH_ABS, 0, 0, 12),                             // 0: ethertype
        op(JEQ, 10, 0, 0x0806),                            // 1: ARP → accept
        op(JEQ, 0, 10, 0x0800),                            // 2: not IPv4 → drop
        op(LD_ABS, 0, 0, 14 + 16),                         // 3: destination address
        op(JEQ, 0, 8, u32::from_be_bytes(ip.octets())),    // 4: not ours → drop
        op(LDB_ABS, 0, 0, 14 + 9),                         // 5: protocol
        op(JEQ, 0, 6, u32::from(libc::IPPROTO_UDP as u8)), // 6: not UDP → drop
        op(LDH_ABS, 0, 0, 14 + 6),                         // 7: MF flag, fragment offset
        op(JSET, 4, 0, 0x3fff),                            // 8: a fragment → drop
        op(LDXB_MSH, 0, 0, 14),                            // 9: X = IPv4 header length
        op(LDH_IND, 0, 0, 14 + 2),                         // 10: UDP destination port
        op(JEQ, 0, 1, ROCE_PORT),                          // 11: not RoCEv2 → drop
        op(RET, 0, 0, 0x0004_0000),                        // 12: ACCEPT
        op(RET, 0, 0, 0),                                  // 13: DROP
    ]
}

/// An `AF_PACKET` socket bound to one interface, non-blocking.
#[derive(Debug)]
pub struct PacketSocket {
    socket: Socket,
    /// Frames the kernel dropped for want of room, summed over reads of
    /// its statistics (which reset them).
    drops: u64,
}

/// What an interface looks like from here.
#[derive(Debug, Clone, Copy)]
pub struct InterfaceInfo {
    /// Its index.
    pub index: u32,
    /// Its MAC address.
    pub mac: [u8; 6],
    /// Its MTU.
    pub mtu: usize,
}

/// Reads `interface`'s index, MAC address and MTU, in the calling thread's
/// network namespace (ioctls, not sysfs, which shows the namespace it was
/// mounted in).
pub fn interface_info(interface: &str) -> io::Result<InterfaceInfo> {
    let name = CString::new(interface).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let ioctl = |request, req: &mut libc::ifreq| {
        // SAFETY: `req` is a live ifreq naming the interface; these requests
        // write only into it.
        let rc = unsafe { libc::ioctl(socket.as_raw_fd(), request, std::ptr::from_mut(req)) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    ioctl(libc::SIOCGIFHWADDR, &mut req)?;
    // SAFETY: SIOCGIFHWADDR filled the union's hardware address member.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hw.sa_data) {
        *dst = src as u8;
    }
    ioctl(libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the union's MTU member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(InterfaceInfo {
        index,
        mac,
        mtu: usize::try_from(mtu).map_err(|_| io::ErrorKind::InvalidData)?,
    })
}

impl PacketSocket {
    /// Opens a socket on interface `index` that receives what `filter`
    /// accepts (needs CAP_NET_RAW).
    pub fn open(index: u32, filter: &[libc::sock_filter]) -> io::Result<Self> {
        let all = (libc::ETH_P_ALL as u16).to_be();
        // Protocol 0: the socket receives nothing until the bind below
        // names a protocol. Opened with ETH_P_ALL it would queue every
        // interface's frames (loopback's among them) before the filter and
        // the bind to one interface are in place.
        let socket = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0)))?;
        // Filter first: frames queued before this would skip it.
        socket.attach_filter(filter)?;
        let one: libc::c_int = 1;
        // SAFETY: the option value is a live c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_IGNORE_OUTGOING,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            // Older kernels: outgoing frames are skipped on receipt instead.
            tracing::debug!("PACKET_IGNORE_OUTGOING: {}", io::Error::last_os_error());
        }
        // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = all;
        addr.sll_ifindex = index as i32;
        // SAFETY: `addr` is a valid sockaddr_ll and its size is passed.
        let rc = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let _ = socket.set_recv_buffer_size(RECV_BUFFER);
        socket.set_nonblocking(true)?;
        Ok(PacketSocket { socket, drops: 0 })
    }

    /// Frames the kernel dropped because the socket's queue was full.
    pub fn drops(&mut self) -> u64 {
        let mut stats = TpacketStats::default();
        let mut len = size_of::<TpacketStats>() as libc::socklen_t;
        // SAFETY: `stats` is a live tpacket_stats and `len` its size.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                (&raw mut stats).cast(),
                &raw mut len,
            )
        };
        if rc == 0 {
            self.drops += u64::from(stats.drops);
        }
        self.drops
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Buffers for up to [`BATCH`] received frames.
#[derive(Debug)]
pub struct RxBatch {
    buf: Vec<u8>,
    cap: usize,
    lens: [usize; BATCH],
    count: usize,
}

impl RxBatch {
    /// Room for frames of up to `frame_cap` bytes.
    pub fn new(frame_cap: usize) -> Self {
        RxBatch {
            buf: vec![0; frame_cap * BATCH],
            cap: frame_cap,
            lens: [0; BATCH],
            count: 0,
        }
    }

    /// Reads the frames waiting (up to [`BATCH`]); returns how many, 0 when
    /// none is.
    pub fn receive(&mut self, socket: &PacketSocket) -> io::Result<usize> {
        self.count = 0;
        let mut iov: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            iov_base: self.buf[i * self.cap..].as_mut_ptr().cast(),
            iov_len: self.cap,
        });
        // SAFETY: sockaddr_ll is plain old data; all zeroes is valid.
        let mut from: [libc::sockaddr_ll; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: mmsghdr is plain old data; all zeroes is valid.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, msg) in msgs.iter_mut().enumerate() {
            msg.msg_hdr.msg_iov = &raw mut iov[i];
            msg.msg_hdr.msg_iovlen = 1;
            msg.msg_hdr.msg_name = (&raw mut from[i]).cast();
            msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        }
        // SAFETY: every header points at a live iovec (into `self.buf`, each
        // `cap` bytes inside it) and a live sockaddr_ll, all of which outlive
        // the call; BATCH headers are passed.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for (i, msg) in msgs.iter().take(n).enumerate() {
            // Frames this host sent (where the kernel could not be told to
            // skip them) and truncated ones are not handed out.
            let truncated = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let outgoing = from[i].sll_pkttype == PACKET_OUTGOING;
            self.lens[i] = if truncated || outgoing {
                0
            } else {
                (msg.msg_len as usize).min(self.cap)
            };
        }
        self.count = n;
        Ok(n)
    }

    /// The frames the last [`RxBatch::receive`] read.
    pub fn frames(&self) -> impl Iterator<Item = &[u8]> {
        self.lens[..self.count]
            .iter()
            .enumerate()
            .filter(|(_, len)| **len > 0)
            .map(|(i, len)| &self.buf[i * self.cap..i * self.cap + len])
    }
}

/// Frames waiting to be sent, written [`BATCH`] at a time.
#[derive(Debug)]
pub struct TxBatch {
    buf: Vec<u8>,
    cap: usize,
    lens: [usize; BATCH],
    count: usize,
    /// Frames the kernel would not take (its queue full), dropped.
    pub dropped: u64,
}

impl TxBatch {
    /// Room for frames of up to `frame_cap` bytes.
    pub fn new(frame_cap: usize) -> Self {
        TxBatch {
            buf: vec![0; frame_cap * BATCH],
            cap: frame_cap,
            lens: [0; BATCH],
            count: 0,
            dropped: 0,
        }
    }

    /// A slot for a frame of `len` bytes to be filled, sending what waits
    /// first when the batch is full; `None` when `len` exceeds the frame
    /// size (the frame is then not sent).
    pub fn slot(&mut self, socket: &PacketSocket, len: usize) -> Option<&mut [u8]> {
        if len > self.cap {
            self.dropped += 1;
            return None;
        }
        if self.count == BATCH {
            self.flush(socket);
        }
        let at = self.count * self.cap;
        self.lens[self.count] = len;
        self.count += 1;
        Some(&mut self.buf[at..at + len])
    }

    /// Sends every frame waiting; returns how many went out.
    pub fn flush(&mut self, socket: &PacketSocket) -> usize {
        let mut sent = 0;
        while sent < self.count {
            let pending = self.count - sent;
            let mut iov: [libc::iovec; BATCH] = std::array::from_fn(|i| {
                let frame = sent + i;
                let (at, len) = if i < pending {
                    (frame * self.cap, self.lens[frame])
                } else {
                    (0, 0)
                };
                libc::iovec {
                    iov_base: self.buf[at..].as_mut_ptr().cast(),
                    iov_len: len,
                }
            });
            // SAFETY: mmsghdr is plain old data; all zeroes is valid.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            for (i, msg) in msgs.iter_mut().enumerate().take(pending) {
                msg.msg_hdr.msg_iov = &raw mut iov[i];
                msg.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: the first `pending` headers point at live iovecs into
            // `self.buf`, which outlive the call. The socket is bound to its
            // interface, so no destination address is needed.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    pending as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                let e = io::Error::last_os_error();
                if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The queue is full (or the interface gone): what is left
                // is lost, as on a congested wire; RC retransmits it.
                self.dropped += pending as u64;
                break;
            }
            sent += n as usize;
        }
        let done = sent.min(self.count);
        self.count = 0;
        done
    }

    /// Whether frames wait to be sent.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter program on `frame` the way the kernel does, for the
    /// instructions it uses.
    fn run(program: &[libc::sock_filter], frame: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let byte = |at: usize| u32::from(frame.get(at).copied().unwrap_or(0));
        loop {
            let i = program[pc];
            let k = i.k as usize;
            pc += 1;
            match i.code {
                0x28 => a = byte(k) << 8 | byte(k + 1),
                0x20 => a = byte(k) << 24 | byte(k + 1) << 16 | byte(k + 2) << 8 | byte(k + 3),
                0x30 => a = byte(k),
                0x48 => a = byte(x as usize + k) << 8 | byte(x as usize + k + 1),
                0xb1 => x = 4 * (byte(k) & 0xf),
                0x15 => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                0x45 => pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf }),
                0x06 => return i.k,
                other => panic!("instruction {other:#x}"),
            }
        }
    }

    fn ipv4_udp(dst: [u8; 4], port: u16, proto: u8, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 6..14 + 8].copy_from_slice(&frag.to_be_bytes());
        f[14 + 9] = proto;
        f[14 + 16..14 + 20].copy_from_slice(&dst);
        f[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&port.to_be_bytes());
        f
    }

    /// A socket opened while other frames flow holds none of them: it
    /// receives nothing before its filter and its interface are set (the
    /// soak once caught a loopback TCP frame in a port's socket).
    #[test]
    fn a_socket_opened_amid_other_traffic_holds_only_what_its_filter_passes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let lo = interface_info("lo").expect("lo");
        let filter = roce_filter(Ipv4Addr::new(127, 0, 0, 1));
        let stop = AtomicBool::new(false);
        let stray = std::thread::scope(|scope| {
            scope.spawn(|| {
                // UDP to the discard port: frames the filter refuses.
                let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
                while !stop.load(Ordering::Relaxed) {
                    let _ = udp.send_to(&[0; 64], "127.0.0.1:9");
                }
            });
            let mut stray = 0;
            let mut batch = RxBatch::new(2048);
            for _ in 0..300 {
                let socket = PacketSocket::open(lo.index, &filter).expect("packet socket");
                while batch.receive(&socket).expect("receive") > 0 {
                    stray += batch.frames().count();
                }
            }
            stop.store(true, Ordering::Relaxed);
            stray
        });
        assert_eq!(stray, 0, "frames the filter refuses were received");
    }

    #[test]
    fn the_filter_keeps_arp_and_roce_to_the_port_only() {
        let program = roce_filter(Ipv4Addr::new(10, 77, 0, 101));
        let ours = [10, 77, 0, 101];
        assert_ne!(run(&program, &ipv4_udp(ours, 4791, 17, 0)), 0);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_ne!(run(&program, &arp), 0);
        for dropped in [
            ipv4_udp([10, 77, 0, 102], 4791, 17, 0), // another address
            ipv4_udp(ours, 4792, 17, 0),             // another port
            ipv4_udp(ours, 4791, 6, 0),              // TCP
            ipv4_udp(ours, 4791, 17, 0x2000),        // first fragment (MF)
            ipv4_udp(ours, 4791, 17, 0x0010),        // later fragment
        ] {
            assert_eq!(run(&program, &dropped), 0, "{dropped:02x?}");
        }
        // Options in the IPv4 header move the UDP header: X follows IHL.
        let mut long = ipv4_udp(ours, 0, 17, 0);
        long[14] = 0x46;
        long.extend_from_slice(&[0; 4]);
        long[14 + 24 + 2..14 + 24 + 4].copy_from_slice(&4791u16.to_be_bytes());
        assert_ne!(run(&program, &long), 0);
        let mut ipv6 = vec![0u8; 60];
        ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(run(&program, &ipv6), 0);
    }
}
