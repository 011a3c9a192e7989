//! A port's RoCEv2 side: raw Ethernet frames on a network interface, ARP
//! for the port's address, and the [`RoceGateway`] that terminates the
//! clients' queue pairs.
//!
//! Frames move through a [`PacketSocket`] that the event loop polls itself:
//! the kernel's filter passes only ARP and IPv4/UDP to port 4791 for this
//! port's address. The loop takes them from rings shared with the kernel,
//! or reads them in batches with one system call ([`Wire`]), and sends what
//! the queue pairs have ready in batches too. All protocol work runs on the
//! event loop thread.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::time::Instant;

use proto::qp;
use proto::roce::rc::{Path, QpConfig};
use proto::{Message, RegionIndex, Status};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpProtocol, Ipv4Packet, UdpPacket,
};
use topology::RocePort;

use super::packet::{PacketSocket, interface_info, roce_filter};
use super::roce_io::{FrameSink, PathFallback, PortAddress, RoceIo, RoceIoConfig, Wire};
use crate::forward::{ConnId, Forwarder, LinkId, Offload};
use crate::rdma::gateway::{QpSetup, RoceGateway, random_u32};
use crate::rdma::metrics::PortSnapshot;
use crate::rdma::uplink::Uplinks;

const ETH_HEADER_LEN: usize = 14;
/// An address not yet resolved is asked for at most this often.
const ARP_RETRY: std::time::Duration = std::time::Duration::from_millis(200);
/// Room for a VLAN tag beyond the interface MTU and Ethernet header.
const FRAME_SLACK: usize = ETH_HEADER_LEN + 4;

/// Why a RoCE port cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RocePortError {
    /// No interface of that name, or its address or MTU is unreadable.
    #[error("network interface {interface:?}")]
    Interface {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The address in the topology is not IPv4.
    #[error("RoCE address {0:?} is not an IPv4 address")]
    BadIp(String),
    /// The raw packet socket could not be opened (needs CAP_NET_RAW).
    #[error("cannot open a raw packet socket on {interface:?} (root or CAP_NET_RAW needed)")]
    Socket {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Counters of a port, read by the metrics exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct PortCounters {
    /// Frames handed to the port.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames the kernel dropped because the port did not read them fast
    /// enough, or could not queue for sending.
    pub rx_overflow: u64,
    /// ARP requests answered.
    pub arp_replies: u64,
    /// Datagrams not sent for want of the peer's MAC address.
    pub no_neighbor: u64,
    /// ARP requests sent (for servers the device's queue pairs reach).
    pub arp_requests: u64,
    /// Malformed datagrams for the device's queue pairs toward servers.
    pub uplink_drops: u64,
    /// Frames whose Ethernet, IPv4 or UDP header does not hold together.
    pub bad_headers: u64,
    /// Receive-ring slots whose descriptor pointed outside the slot.
    pub ring_malformed: u64,
    /// Frames longer than a receive-ring slot, dropped.
    pub ring_truncated: u64,
}

/// The RoCEv2 side of one port.
#[derive(Debug)]
pub struct RoceEndpoint {
    interface: String,
    ip: Ipv4Addr,
    mac: EthernetAddress,
    mtu: u16,
    wire: Wire,
    neighbors: HashMap<Ipv4Addr, EthernetAddress>,
    /// When each unresolved address was last asked for.
    arp_asked: HashMap<Ipv4Addr, Instant>,
    /// The gateway terminating the queue pairs.
    pub gateway: RoceGateway,
    /// Queue pairs by the control connection that set them up.
    owners: HashMap<ConnId, Vec<u32>>,
    counters: PortCounters,
    datagram: Vec<u8>,
}

impl RoceEndpoint {
    /// Opens the interface's frame path `io` asks for; register its
    /// descriptors with the event loop ([`RoceEndpoint::sources`]) to hear
    /// of frames. Also returns the path asked for that does not run, and
    /// why, if so.
    pub fn open(
        spec: &RocePort,
        io: &RoceIoConfig,
    ) -> Result<(Self, Option<PathFallback>), RocePortError> {
        let ip: Ipv4Addr = spec
            .ip
            .parse()
            .map_err(|_| RocePortError::BadIp(spec.ip.clone()))?;
        let info = interface_info(&spec.interface).map_err(|source| RocePortError::Interface {
            interface: spec.interface.clone(),
            source,
        })?;
        let filter = roce_filter(ip);
        let open_socket = || PacketSocket::open(info.index, &filter);
        let socket_error = |source| RocePortError::Socket {
            interface: spec.interface.clone(),
            source,
        };
        let socket = open_socket().map_err(socket_error)?;
        let frame_cap = info.mtu + FRAME_SLACK;
        let port = PortAddress {
            ifindex: info.index,
            ip,
        };
        let (wire, fallback) =
            Wire::open(socket, port, frame_cap, io, open_socket).map_err(socket_error)?;
        let endpoint = RoceEndpoint {
            interface: spec.interface.clone(),
            ip,
            mac: EthernetAddress(info.mac),
            mtu: spec.mtu,
            wire,
            neighbors: HashMap::new(),
            arp_asked: HashMap::new(),
            gateway: RoceGateway::new(),
            owners: HashMap::new(),
            counters: PortCounters::default(),
            datagram: Vec::new(),
        };
        Ok((endpoint, fallback))
    }

    /// The descriptors to register with the event loop (readable).
    pub fn sources(&self) -> Vec<std::os::fd::RawFd> {
        self.wire.sources()
    }

    /// The frame path the port runs.
    pub fn io_path(&self) -> RoceIo {
        self.wire.path()
    }

    /// The frame path in words, for the start-up line.
    pub fn io_description(&self) -> String {
        self.wire.describe()
    }

    /// The port's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The port's counters.
    pub fn counters(&mut self) -> PortCounters {
        let mut c = self.counters;
        c.rx_overflow = self.wire.overflow();
        (c.ring_malformed, c.ring_truncated) = self.wire.ring_faults();
        c
    }

    /// Everything the port counts, for `/metrics`.
    pub fn snapshot(&mut self, port: &str) -> PortSnapshot {
        let c = self.counters();
        PortSnapshot {
            port: port.to_owned(),
            gateway: *self.gateway.counters(),
            rx_overflow: c.rx_overflow,
            arp_replies: c.arp_replies,
            no_neighbor: c.no_neighbor,
            bad_headers: c.bad_headers,
            ring_malformed: c.ring_malformed,
            ring_truncated: c.ring_truncated,
            af_xdp_frames: self.wire.xdp_received().map_or(0, |(xsk, _)| xsk),
            qps: self.gateway.qp_counters().map(|(n, c)| (n, *c)).collect(),
            totals: self.gateway.totals(),
        }
    }

    /// Handles every frame waiting on the socket (until it would block):
    /// datagrams for the device's queue pairs toward servers go to
    /// `uplinks`, the others to the gateway; `send` takes the gateway's
    /// requests for links.
    pub fn receive(
        &mut self,
        now: Instant,
        core: &mut Forwarder,
        uplinks: &mut Uplinks,
        mut send: impl FnMut(&mut Uplinks, LinkId, &[u8], &[u8], Option<Offload>),
    ) {
        let Self {
            wire,
            ip,
            mac,
            neighbors,
            gateway,
            counters,
            ..
        } = self;
        let drained = wire.drain(|frame, sink| {
            counters.frames_in += 1;
            // The kernel's filter chose these; checked again in case a
            // frame was queued before the filter was attached.
            match classify(frame, *ip) {
                Verdict::Wanted => {}
                Verdict::Other => return,
                Verdict::BadHeaders => {
                    counters.bad_headers += 1;
                    return;
                }
            }
            let Ok(eth) = EthernetFrame::new_checked(frame) else {
                return;
            };
            match eth.ethertype() {
                EthernetProtocol::Arp => {
                    let mut port = ArpPort {
                        ip: *ip,
                        mac: *mac,
                        neighbors,
                        sink,
                        counters,
                    };
                    port.answer(&eth);
                }
                EthernetProtocol::Ipv4 => {
                    let payload = eth.payload();
                    if let Ok(packet) = Ipv4Packet::new_checked(payload) {
                        neighbors.insert(packet.src_addr(), eth.src_addr());
                    }
                    if dest_qpn(payload).is_some_and(|qpn| uplinks.owns(qpn)) {
                        match proto::roce::Datagram::new_checked(payload) {
                            Ok(d) => uplinks.handle_datagram(now, &d),
                            Err(_) => counters.uplink_drops += 1,
                        }
                    } else {
                        gateway.handle_datagram(now, payload, core, |l, h, p, r| {
                            send(uplinks, l, h, p, r)
                        });
                    }
                }
                _ => {}
            }
        });
        match drained {
            Ok(sent) => self.counters.frames_out += sent,
            Err(e) => tracing::warn!("RoCE port on {}: receive failed: {e}", self.interface),
        }
    }

    /// Sends every datagram the queue pairs have ready (the gateway's, and
    /// `uplinks`' of this port, index `index`); whether there were any.
    pub fn transmit(&mut self, now: Instant, uplinks: &mut Uplinks, index: usize) -> bool {
        let mut any = false;
        while self.gateway.poll_transmit(now, &mut self.datagram)
            || uplinks.poll_transmit(index, now, &mut self.datagram)
        {
            any = true;
            let Some(dst) = self
                .datagram
                .get(16..20)
                .map(|b| Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            else {
                continue;
            };
            let Some(&mac) = self.neighbors.get(&dst) else {
                self.counters.no_neighbor += 1;
                // The queue pair resends after its ACK timeout; by then
                // the answer is in.
                self.ask_for(dst, now);
                continue;
            };
            let Some(slot) = self.wire.slot(ETH_HEADER_LEN + self.datagram.len()) else {
                continue;
            };
            let mut frame = EthernetFrame::new_unchecked(slot);
            EthernetRepr {
                src_addr: self.mac,
                dst_addr: mac,
                ethertype: EthernetProtocol::Ipv4,
            }
            .emit(&mut frame);
            frame.payload_mut().copy_from_slice(&self.datagram);
        }
        self.counters.frames_out += self.wire.flush();
        any
    }

    /// Broadcasts an ARP request for `ip`, at most every [`ARP_RETRY`].
    fn ask_for(&mut self, ip: Ipv4Addr, now: Instant) {
        if self
            .arp_asked
            .get(&ip)
            .is_some_and(|t| now.saturating_duration_since(*t) < ARP_RETRY)
        {
            return;
        }
        self.arp_asked.insert(ip, now);
        let request = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: self.mac,
            source_protocol_addr: self.ip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: ip,
        };
        let Some(slot) = self.wire.slot(ETH_HEADER_LEN + request.buffer_len()) else {
            return;
        };
        let mut frame = EthernetFrame::new_unchecked(slot);
        EthernetRepr {
            src_addr: self.mac,
            dst_addr: EthernetAddress::BROADCAST,
            ethertype: EthernetProtocol::Arp,
        }
        .emit(&mut frame);
        request.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
        self.counters.arp_requests += 1;
    }

    /// The port's path MTU for queue pairs.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Sets up a queue pair for control connection `conn` (authenticated
    /// as a client) and returns the QP_ACCEPT frame, or the error reply.
    pub fn connect(
        &mut self,
        core: &mut Forwarder,
        conn: ConnId,
        connect: qp::Connect,
        tag: u64,
    ) -> Vec<u8> {
        let end = connect.endpoint;
        let refuse = |status| proto::error_reply(proto::Opcode::QpConnect, tag, status).to_vec();
        let Some(client) = core.session_client(conn).map(str::to_owned) else {
            return refuse(Status::UnknownClient);
        };
        let regions = core.map().layout.entries().len();
        let mut table = Vec::with_capacity(regions);
        let mut rkeys = Vec::with_capacity(regions);
        for region in (0..regions).map(|r| RegionIndex(u32::try_from(r).unwrap_or(u32::MAX))) {
            let rkey = fresh_rkey(&rkeys);
            table.push((region.0, rkey));
            rkeys.push((rkey, region));
        }
        let pmtu = usize::from(end.mtu.min(self.mtu));
        let send_psn = random_u32() & 0xFF_FFFF;
        let mut config = QpConfig::new(
            0,
            end.qpn,
            Path {
                local_ip: self.ip,
                remote_ip: end.ip,
                src_port: 0xC000 | (end.qpn as u16 & 0x3FFF),
                dscp: 0,
                ttl: 64,
            },
        );
        config.pmtu = pmtu;
        config.recv_psn = proto::roce::Psn::new(end.psn);
        config.send_psn = proto::roce::Psn::new(send_psn);
        let qpn = match self.gateway.open(
            core,
            QpSetup {
                client,
                config,
                rkeys,
                atomics: connect.atomics,
                epoch: core.qp_epoch(conn, connect.epoch),
            },
        ) {
            Ok(qpn) => qpn,
            Err(_) => return refuse(Status::BadRequest),
        };
        self.owners.entry(conn).or_default().push(qpn);
        let encoded = qp::encode_rkeys(&table);
        let accept = qp::Endpoint {
            qpn,
            psn: send_psn,
            ip: self.ip,
            mtu: pmtu as u16,
        };
        match qp::Accept::new(accept, &encoded)
            .and_then(|a| Message::QpAccept(a).encode_to_vec(tag))
        {
            Ok(frame) => frame,
            Err(_) => refuse(Status::IoError),
        }
    }

    /// Whether control connection `conn` set up queue pairs here (its own
    /// traffic then stays quiet while they work).
    pub fn has_queue_pairs(&self, conn: ConnId) -> bool {
        self.owners.get(&conn).is_some_and(|q| !q.is_empty())
    }

    /// The control connection `conn` closed: its queue pairs go with it.
    pub fn control_closed(&mut self, core: &mut Forwarder, conn: ConnId) {
        for qpn in self.owners.remove(&conn).unwrap_or_default() {
            self.gateway.close(core, qpn);
        }
    }
}

/// The destination QP number of a RoCEv2 datagram (IPv4 + UDP + BTH), read
/// before any check: only to choose who checks it.
fn dest_qpn(ip_datagram: &[u8]) -> Option<u32> {
    let ip = Ipv4Packet::new_checked(ip_datagram).ok()?;
    let udp = UdpPacket::new_checked(ip.payload()).ok()?;
    let bth = udp.payload().get(4..8)?;
    Some(u32::from_be_bytes([0, bth[1], bth[2], bth[3]]))
}

/// What the port makes of a frame the kernel handed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// ARP, or IPv4/UDP to 4791 for the port's address.
    Wanted,
    /// Well formed and not for the port (queued before the filter was
    /// attached).
    Other,
    /// Its Ethernet, IPv4 or UDP header does not hold together (a length
    /// past the end of the frame, or below the header's own).
    BadHeaders,
}

/// Whether the port wants a frame: ARP, or IPv4/UDP to 4791 for `ip`.
fn classify(frame: &[u8], ip: Ipv4Addr) -> Verdict {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Verdict::BadHeaders;
    };
    match eth.ethertype() {
        EthernetProtocol::Arp => Verdict::Wanted,
        EthernetProtocol::Ipv4 => {
            let Ok(packet) = Ipv4Packet::new_checked(eth.payload()) else {
                return Verdict::BadHeaders;
            };
            if packet.dst_addr() != ip || packet.next_header() != IpProtocol::Udp {
                return Verdict::Other;
            }
            match UdpPacket::new_checked(packet.payload()) {
                Err(_) => Verdict::BadHeaders,
                Ok(u) if u.dst_port() == proto::roce::UDP_PORT => Verdict::Wanted,
                Ok(_) => Verdict::Other,
            }
        }
        _ => Verdict::Other,
    }
}

/// What answering ARP needs of a port, borrowed apart from its receive
/// buffers.
struct ArpPort<'a> {
    ip: Ipv4Addr,
    mac: EthernetAddress,
    neighbors: &'a mut HashMap<Ipv4Addr, EthernetAddress>,
    sink: &'a mut dyn FrameSink,
    counters: &'a mut PortCounters,
}

impl ArpPort<'_> {
    /// Learns the sender of an ARP packet and answers a request for the
    /// port's address.
    fn answer(&mut self, eth: &EthernetFrame<&[u8]>) {
        let Ok(packet) = ArpPacket::new_checked(eth.payload()) else {
            return;
        };
        let Ok(ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        }) = ArpRepr::parse(&packet)
        else {
            return;
        };
        self.neighbors
            .insert(source_protocol_addr, source_hardware_addr);
        if operation != ArpOperation::Request || target_protocol_addr != self.ip {
            return;
        }
        let reply = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: self.mac,
            source_protocol_addr: self.ip,
            target_hardware_addr: source_hardware_addr,
            target_protocol_addr: source_protocol_addr,
        };
        let Some(slot) = self.sink.slot(ETH_HEADER_LEN + reply.buffer_len()) else {
            return;
        };
        let mut frame = EthernetFrame::new_unchecked(slot);
        EthernetRepr {
            src_addr: self.mac,
            dst_addr: source_hardware_addr,
            ethertype: EthernetProtocol::Arp,
        }
        .emit(&mut frame);
        reply.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
        self.counters.arp_replies += 1;
    }
}

/// A random non-zero R_Key not in `taken`.
fn fresh_rkey(taken: &[(u32, RegionIndex)]) -> u32 {
    loop {
        let rkey = random_u32();
        if rkey != 0 && !taken.iter().any(|(r, _)| *r == rkey) {
            return rkey;
        }
    }
}
