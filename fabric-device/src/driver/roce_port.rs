//! A port's RoCEv2 side: raw Ethernet frames on a network interface
//! (pnet's datalink channel), ARP for the port's address, and the
//! [`RoceGateway`] that terminates the clients' queue pairs.
//!
//! A reader thread takes frames from the interface, keeps only ARP and
//! IPv4/UDP to port 4791 for this port's address, and hands them to the
//! event loop through a channel and a mio waker; the event loop does all
//! protocol work and sends frames itself.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pnet_datalink::{Channel, Config, DataLinkSender};
use proto::qp;
use proto::roce::rc::{Path, QpConfig};
use proto::{Message, Status};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpProtocol, Ipv4Packet, UdpPacket,
};
use topology::RocePort;

use crate::forward::{ConnId, Forwarder, LinkId};
use crate::roce::{QpSetup, RoceGateway};
use crate::roce_metrics::PortSnapshot;

/// Frames queued between the reader thread and the event loop; beyond
/// this the reader drops (as a full NIC ring would) and counts.
const RX_QUEUE: usize = 4096;
const ETH_HEADER_LEN: usize = 14;

/// Why a RoCE port cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RocePortError {
    /// No interface of that name.
    #[error("network interface {0:?} not found")]
    NoInterface(String),
    /// The interface has no MAC address (not Ethernet).
    #[error("network interface {0:?} has no MAC address")]
    NoMac(String),
    /// The address in the topology is not IPv4.
    #[error("RoCE address {0:?} is not an IPv4 address")]
    BadIp(String),
    /// The raw packet channel could not be opened (needs CAP_NET_RAW).
    #[error("cannot open a raw packet channel on {interface:?} (root or CAP_NET_RAW needed)")]
    Channel {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The channel is not an Ethernet one.
    #[error("{0:?} did not give an Ethernet channel")]
    NotEthernet(String),
    /// The reader thread could not start.
    #[error("cannot start the reader thread")]
    Thread(#[source] io::Error),
}

/// Counters of a port, read by the metrics exporter.
#[derive(Debug, Default, Clone, Copy)]
pub struct PortCounters {
    /// Frames handed to the event loop.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames dropped because the event loop fell behind.
    pub rx_overflow: u64,
    /// ARP requests answered.
    pub arp_replies: u64,
    /// Datagrams not sent for want of the peer's MAC address.
    pub no_neighbor: u64,
}

/// The RoCEv2 side of one port.
pub struct RoceEndpoint {
    interface: String,
    ip: Ipv4Addr,
    mac: EthernetAddress,
    mtu: u16,
    tx: Box<dyn DataLinkSender>,
    rx: Receiver<Vec<u8>>,
    overflow: Arc<Mutex<u64>>,
    /// Set by the reader when it queues a frame and has woken the loop;
    /// cleared by the loop before it drains, so one wake covers a burst.
    woken: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    neighbors: HashMap<Ipv4Addr, EthernetAddress>,
    /// The gateway terminating the queue pairs.
    pub gateway: RoceGateway,
    /// Queue pairs by the control connection that set them up.
    owners: HashMap<ConnId, Vec<u32>>,
    counters: PortCounters,
    frame: Vec<u8>,
    datagram: Vec<u8>,
}

impl std::fmt::Debug for RoceEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceEndpoint")
            .field("interface", &self.interface)
            .field("ip", &self.ip)
            .field("mac", &self.mac)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl RoceEndpoint {
    /// Opens the interface and starts the reader; `wake` tells the event
    /// loop that frames are waiting.
    pub fn open(spec: &RocePort, wake: Arc<mio::Waker>) -> Result<Self, RocePortError> {
        let ip: Ipv4Addr = spec
            .ip
            .parse()
            .map_err(|_| RocePortError::BadIp(spec.ip.clone()))?;
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == spec.interface)
            .ok_or_else(|| RocePortError::NoInterface(spec.interface.clone()))?;
        let mac = iface
            .mac
            .ok_or_else(|| RocePortError::NoMac(spec.interface.clone()))?;
        let config = Config {
            read_timeout: Some(Duration::from_millis(100)),
            ..Config::default()
        };
        let (tx, mut raw_rx) = match pnet_datalink::channel(&iface, config) {
            Ok(Channel::Ethernet(tx, rx)) => (tx, rx),
            Ok(_) => return Err(RocePortError::NotEthernet(spec.interface.clone())),
            Err(source) => {
                return Err(RocePortError::Channel {
                    interface: spec.interface.clone(),
                    source,
                });
            }
        };
        let (to_loop, rx): (SyncSender<Vec<u8>>, _) = sync_channel(RX_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let overflow = Arc::new(Mutex::new(0));
        let woken = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = Arc::clone(&stop);
            let overflow = Arc::clone(&overflow);
            let woken = Arc::clone(&woken);
            std::thread::Builder::new()
                .name(format!("roce-rx-{}", spec.interface))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(frame) = raw_rx.next() else { continue };
                        if !wanted(frame, ip) {
                            continue;
                        }
                        match to_loop.try_send(frame.to_vec()) {
                            Ok(()) => {
                                if !woken.swap(true, Ordering::AcqRel) {
                                    let _ = wake.wake();
                                }
                            }
                            Err(TrySendError::Full(_)) => {
                                if let Ok(mut n) = overflow.lock() {
                                    *n += 1;
                                }
                            }
                            Err(TrySendError::Disconnected(_)) => return,
                        }
                    }
                })
                .map_err(RocePortError::Thread)?
        };
        Ok(RoceEndpoint {
            interface: spec.interface.clone(),
            ip,
            mac: EthernetAddress(mac.octets()),
            mtu: spec.mtu,
            tx,
            rx,
            overflow,
            woken,
            stop,
            reader: Some(reader),
            neighbors: HashMap::new(),
            gateway: RoceGateway::new(),
            owners: HashMap::new(),
            counters: PortCounters::default(),
            frame: Vec::new(),
            datagram: Vec::new(),
        })
    }

    /// The port's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The port's counters.
    pub fn counters(&self) -> PortCounters {
        let mut c = self.counters;
        c.rx_overflow = self.overflow.lock().map_or(0, |n| *n);
        c
    }

    /// Everything the port counts, for `/metrics`.
    pub fn snapshot(&self, port: &str) -> PortSnapshot {
        let c = self.counters();
        PortSnapshot {
            port: port.to_owned(),
            gateway: *self.gateway.counters(),
            rx_overflow: c.rx_overflow,
            arp_replies: c.arp_replies,
            no_neighbor: c.no_neighbor,
            qps: self.gateway.qp_counters().map(|(n, c)| (n, *c)).collect(),
            totals: self.gateway.totals(),
        }
    }

    /// Handles every frame the reader queued; `send` takes requests for links.
    pub fn receive(
        &mut self,
        now: Instant,
        core: &mut Forwarder,
        mut send: impl FnMut(LinkId, &[u8], &[u8]),
    ) {
        self.woken.store(false, Ordering::Release);
        while let Ok(frame) = self.rx.try_recv() {
            self.counters.frames_in += 1;
            let Ok(eth) = EthernetFrame::new_checked(&frame[..]) else {
                continue;
            };
            match eth.ethertype() {
                EthernetProtocol::Arp => self.arp(&eth),
                EthernetProtocol::Ipv4 => {
                    let payload = eth.payload();
                    if let Ok(ip) = Ipv4Packet::new_checked(payload) {
                        self.neighbors.insert(ip.src_addr(), eth.src_addr());
                    }
                    self.gateway.handle_datagram(now, payload, core, &mut send);
                }
                _ => {}
            }
        }
    }

    fn arp(&mut self, eth: &EthernetFrame<&[u8]>) {
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
        let eth = EthernetRepr {
            src_addr: self.mac,
            dst_addr: source_hardware_addr,
            ethertype: EthernetProtocol::Arp,
        };
        self.frame.clear();
        self.frame.resize(ETH_HEADER_LEN + reply.buffer_len(), 0);
        let mut frame = EthernetFrame::new_unchecked(&mut self.frame[..]);
        eth.emit(&mut frame);
        reply.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
        if send_frame(&mut self.tx, &self.frame) {
            self.counters.arp_replies += 1;
            self.counters.frames_out += 1;
        }
    }

    /// Sends every datagram the queue pairs have ready; whether there were any.
    pub fn transmit(&mut self, now: Instant) -> bool {
        let mut any = false;
        while self.gateway.poll_transmit(now, &mut self.datagram) {
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
                continue;
            };
            self.frame.clear();
            self.frame.resize(ETH_HEADER_LEN + self.datagram.len(), 0);
            let mut frame = EthernetFrame::new_unchecked(&mut self.frame[..]);
            EthernetRepr {
                src_addr: self.mac,
                dst_addr: mac,
                ethertype: EthernetProtocol::Ipv4,
            }
            .emit(&mut frame);
            frame.payload_mut().copy_from_slice(&self.datagram);
            if send_frame(&mut self.tx, &self.frame) {
                self.counters.frames_out += 1;
            }
        }
        any
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
        let entries: Vec<(u32, u64)> = core
            .map()
            .layout
            .entries()
            .iter()
            .map(|e| (e.region.0, e.key))
            .collect();
        let mut table = Vec::with_capacity(entries.len());
        let mut rkeys = Vec::with_capacity(entries.len());
        for (region, key) in entries {
            let rkey = fresh_rkey(&rkeys);
            table.push((region, rkey));
            rkeys.push((rkey, key));
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

    /// The control connection `conn` closed: its queue pairs go with it.
    pub fn control_closed(&mut self, core: &mut Forwarder, conn: ConnId) {
        for qpn in self.owners.remove(&conn).unwrap_or_default() {
            self.gateway.close(core, qpn);
        }
    }
}

impl Drop for RoceEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Whether the reader should pass a frame on: ARP, or IPv4/UDP to 4791 for `ip`.
fn wanted(frame: &[u8], ip: Ipv4Addr) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    match eth.ethertype() {
        EthernetProtocol::Arp => true,
        EthernetProtocol::Ipv4 => {
            let Ok(packet) = Ipv4Packet::new_checked(eth.payload()) else {
                return false;
            };
            packet.dst_addr() == ip
                && packet.next_header() == IpProtocol::Udp
                && UdpPacket::new_checked(packet.payload())
                    .is_ok_and(|u| u.dst_port() == proto::roce::UDP_PORT)
        }
        _ => false,
    }
}

fn send_frame(tx: &mut Box<dyn DataLinkSender>, frame: &[u8]) -> bool {
    matches!(tx.send_to(frame, None), Some(Ok(())))
}

/// A random non-zero R_Key not in `taken`.
fn fresh_rkey(taken: &[(u32, u64)]) -> u32 {
    loop {
        let rkey = random_u32();
        if rkey != 0 && !taken.iter().any(|(r, _)| *r == rkey) {
            return rkey;
        }
    }
}

/// 32 random bits from the operating system.
fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    // The OS source does not fail on Linux once booted; if it ever did, the
    // key would be a guessable zero-based value, so fall back to the
    // process's randomly seeded hasher rather than a constant.
    if getrandom::fill(&mut bytes).is_err() {
        use std::hash::{BuildHasher, RandomState};
        return RandomState::new().hash_one(Instant::now()) as u32;
    }
    u32::from_le_bytes(bytes)
}
