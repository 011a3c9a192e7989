//! A RoCEv2 client for tests and load generation: the RC requester of
//! `proto::roce::rc` over raw IPv4 sockets.
//!
//! The kernel routes and resolves ARP; this process builds whole IPv4
//! datagrams itself (the ICRC covers the IPv4 and UDP headers, so the
//! kernel must not write them) and reads every UDP datagram the host gets,
//! keeping those for RoCEv2 from its peer. A UDP socket bound to port 4791
//! keeps the kernel from answering the peer with ICMP port unreachable.
//! Needs CAP_NET_RAW (tests run as root, typically in a network namespace).

mod burst;

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use proto::Message;
use proto::qp::{self, Endpoint};
use proto::roce::Psn;
use proto::roce::rc::{Completion, Path, QpConfig, QueuePair, RemoteAddr};
use socket2::{Domain, Protocol, Socket, Type};

use crate::Conn;

/// Why a RoCE client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RoceClientError {
    /// A raw or UDP socket could not be opened.
    #[error("cannot open the {what} socket (CAP_NET_RAW needed)")]
    Socket {
        /// Which socket.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The device refused the queue pair or answered something else.
    #[error("the device did not accept the queue pair: {0}")]
    Refused(String),
    /// The queue pair attributes the device sent are unusable.
    #[error("queue pair attributes")]
    Config(#[source] proto::roce::rc::ConfigError),
}

/// A queue pair to a fabric device's RoCEv2 port, set up over a control connection.
#[derive(Debug)]
pub struct RawRoceClient {
    /// The queue pair: post work requests here, then [`RawRoceClient::run`].
    pub qp: QueuePair,
    rkeys: HashMap<u32, u32>,
    device: Ipv4Addr,
    tx: Socket,
    rx: Socket,
    _sink: UdpSocket,
    outbox: burst::Outbox,
    inbox: burst::Inbox,
}

impl RawRoceClient {
    /// Asks the device on `control` (a connection that already sent HELLO)
    /// for a queue pair; this end is `local_ip` with QP number `qpn`.
    pub fn connect(
        control: &mut Conn,
        local_ip: Ipv4Addr,
        qpn: u32,
    ) -> Result<Self, RoceClientError> {
        Self::connect_with_lane(control, local_ip, qpn, None)
    }

    /// As [`RawRoceClient::connect`]; with `atomics`, the device numbers the
    /// queue pair's atomics for exactly-once execution on that lane.
    pub fn connect_with_lane(
        control: &mut Conn,
        local_ip: Ipv4Addr,
        qpn: u32,
        atomics: Option<qp::AtomicSeq>,
    ) -> Result<Self, RoceClientError> {
        let open = |what, domain, ty, protocol| {
            Socket::new(domain, ty, protocol)
                .map_err(|source| RoceClientError::Socket { what, source })
        };
        let tx = open(
            "raw IPv4",
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )?;
        let rx = open("raw UDP", Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
        rx.set_read_timeout(Some(Duration::from_millis(1)))
            .map_err(|source| RoceClientError::Socket {
                what: "raw UDP",
                source,
            })?;
        let sink = UdpSocket::bind((local_ip, proto::roce::UDP_PORT)).map_err(|source| {
            RoceClientError::Socket {
                what: "UDP 4791",
                source,
            }
        })?;
        let psn = std::process::id() & 0xFF_FFFF;
        let end = Endpoint {
            qpn,
            psn,
            ip: local_ip,
            mtu: 1024,
        };
        control.send(&Message::QpConnect(qp::Connect {
            endpoint: end,
            atomics,
            epoch: None,
        }));
        let reply = control.recv();
        if reply.opcode != proto::Opcode::QpAccept {
            return Err(RoceClientError::Refused(format!(
                "{} with status {}",
                reply.opcode, reply.status
            )));
        }
        let accept =
            qp::Accept::parse(&reply.data).map_err(|e| RoceClientError::Refused(e.to_string()))?;
        let mut config = QpConfig::new(
            qpn,
            accept.endpoint.qpn,
            Path {
                local_ip,
                remote_ip: accept.endpoint.ip,
                src_port: 0xC000 | (qpn as u16 & 0x3FFF),
                dscp: 0,
                ttl: 64,
            },
        );
        config.pmtu = usize::from(accept.endpoint.mtu);
        config.send_psn = Psn::new(psn);
        config.recv_psn = Psn::new(accept.endpoint.psn);
        config.timeout = 12;
        Ok(RawRoceClient {
            qp: QueuePair::new(config).map_err(RoceClientError::Config)?,
            rkeys: accept.rkeys().collect(),
            device: accept.endpoint.ip,
            tx,
            rx,
            _sink: sink,
            outbox: burst::Outbox::default(),
            inbox: burst::Inbox::default(),
        })
    }

    /// The remote address of PMEM address `va` in region `region`.
    pub fn remote(&self, region: u32, va: u64) -> RemoteAddr {
        RemoteAddr {
            va,
            rkey: self.rkeys.get(&region).copied().unwrap_or(0),
        }
    }

    /// Moves packets until every posted work request has completed or
    /// `timeout` passes; returns the completions in order. Every packet
    /// the queue pair has ready goes out in one burst, as an RNIC sends a
    /// doorbell's worth of work.
    pub fn run(&mut self, timeout: Duration) -> io::Result<Vec<Completion>> {
        let deadline = Instant::now() + timeout;
        let mut done = Vec::new();
        loop {
            let now = Instant::now();
            while self.qp.poll_transmit(now, self.outbox.slot()) {
                self.outbox.commit();
                if self.outbox.is_full() {
                    self.outbox.send(&self.tx, self.device)?;
                }
            }
            self.outbox.send(&self.tx, self.device)?;
            while let Some(c) = self.qp.poll_completion() {
                done.push(c);
            }
            if self.qp.outstanding() == 0 {
                return Ok(done);
            }
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{} work requests still outstanding", self.qp.outstanding()),
                ));
            }
            self.inbox.receive(&self.rx)?;
            let now = Instant::now();
            for bytes in self.inbox.datagrams() {
                // The raw socket sees every UDP datagram; the queue pair
                // drops and counts what is not RoCEv2 from the device.
                if bytes.len() >= 24 && bytes[12..16] == self.device.octets() {
                    self.qp.handle_datagram(now, bytes);
                }
            }
            if self.qp.poll_timeout().is_some_and(|t| t <= Instant::now()) {
                self.qp.handle_timeout(Instant::now());
            }
        }
    }
}
