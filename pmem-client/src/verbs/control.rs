//! A blocking control connection to a fabric device port: HELLO (and MAP,
//! to check the layout digest), then QP_CONNECT / QP_ACCEPT, and the
//! device requests a queue pair cannot carry (FLUSH, and an in-doubt
//! atomic asked again with its exactly-once identity).
//!
//! The async path connection ([`crate::conn`]) hands only responses to its
//! callers, so queue pair set-up uses this small synchronous one; it shares
//! the protocol version, capabilities and errors of [`crate::conn`]. The
//! device tears a client's queue pairs down when this connection closes, so
//! keep it open as long as the queue pair is used.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use proto::hello::{Capabilities, Role};
use proto::opening::{Opening, OpeningError, OpeningTags, Progress};
use proto::qp::{Connect, Endpoint};
use proto::{FrameDecoder, Message, Status, request};

use super::error::ControlError;
use crate::conn::{CLIENT_CAPABILITIES, ConnectError, Response, check_digest, opening_error};

/// A device's answer to QP_CONNECT, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAccept {
    /// The device's end of the queue pair.
    pub endpoint: Endpoint,
    /// R_Key per region index.
    pub rkeys: HashMap<u32, u32>,
}

/// A blocking control connection, authenticated with HELLO.
#[derive(Debug)]
pub struct Control {
    stream: TcpStream,
    decoder: FrameDecoder,
    /// Complete frames received but not yet handed out.
    frames: VecDeque<Vec<u8>>,
    addr: String,
    next_tag: u64,
    /// The device's name from its HELLO.
    pub device: String,
    /// The device's MAP from the opening, when it was asked for: the
    /// region keys this client may use.
    pub map: Option<proto::map::Repr>,
    /// What the device's HELLO said it can do.
    pub capabilities: Capabilities,
}

impl Control {
    /// Connects to the device port `addr`, sends HELLO as `client` and, when
    /// `digest` is given, fetches MAP and checks the layout digest. Every
    /// connect, write and read waits at most `timeout`.
    pub fn connect(
        addr: SocketAddr,
        client: &str,
        digest: Option<[u8; 32]>,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        Self::connect_with(addr, client, None, digest, timeout)
    }

    /// [`Control::connect`], proving the client's `key` (and checking the
    /// device's proof) when one is given.
    pub fn connect_with(
        addr: SocketAddr,
        client: &str,
        key: Option<proto::auth::Key>,
        digest: Option<[u8; 32]>,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let name = addr.to_string();
        let io_err = |source| ConnectError::Io {
            addr: name.clone(),
            source,
        };
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io_err)?;
        stream.set_nodelay(true).map_err(io_err)?;
        stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
        stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
        let mut control = Control {
            stream,
            decoder: FrameDecoder::new(),
            frames: VecDeque::new(),
            addr: name.clone(),
            next_tag: 1,
            device: String::new(),
            map: None,
            capabilities: Capabilities::NONE,
        };
        let mut out = Vec::new();
        let mut opening = Opening::start(
            Role::Client,
            CLIENT_CAPABILITIES,
            client,
            digest.is_some(),
            OpeningTags::CLIENT,
            key.map(crate::conn::credentials),
            &mut out,
        )
        .map_err(|e| opening_error(&name, client, OpeningError::Malformed(e)))?;
        control.stream.write_all(&out).map_err(io_err)?;
        control.next_tag = OpeningTags::CLIENT.map + 1;
        loop {
            let frame = control.recv().map_err(io_err)?;
            out.clear();
            let progress = opening.handle_frame(&frame, &mut out);
            control.stream.write_all(&out).map_err(io_err)?;
            match progress {
                Ok(Progress::Waiting) => {}
                Ok(Progress::Opened(opened)) => {
                    if let Some(digest) = digest {
                        check_digest(&name, &opened.peer, opened.map.as_ref(), digest)?;
                    }
                    control.device = opened.peer;
                    control.map = opened.map;
                    control.capabilities = opened.capabilities;
                    return Ok(control);
                }
                Err(e) => return Err(opening_error(&name, client, e)),
            }
        }
    }

    /// The device port's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The map epoch to say in QP_CONNECT for a client that runs
    /// `map_epoch` (0: it follows no map): said only to a device whose
    /// HELLO takes it (an older device refuses the longer body).
    pub fn epoch_to_say(&self, map_epoch: u64) -> Option<u64> {
        (map_epoch > 0 && self.capabilities.contains(Capabilities::QP_EPOCH)).then_some(map_epoch)
    }

    /// Sends QP_CONNECT with this end and waits for QP_ACCEPT. A device
    /// on a newer map epoch than the one `connect` says refuses it:
    /// [`ConnectError::NewerMap`] with the device's epoch.
    pub fn qp_connect(&mut self, connect: Connect) -> Result<QpAccept, ControlError> {
        let addr = self.addr.clone();
        let (tag, frame) = self.exchange(&Message::QpConnect(connect))?;
        match proto::parse_frame(&frame) {
            Ok((Message::QpAccept(a), t)) if t == tag => Ok(QpAccept {
                endpoint: a.endpoint,
                rkeys: a.rkeys().collect(),
            }),
            Ok((Message::Response(r), t)) if t == tag && r.status == Status::StaleMap => {
                Err(ControlError::Connect(ConnectError::NewerMap {
                    addr,
                    device: self.device.clone(),
                    ours: connect.epoch.unwrap_or(0),
                    theirs: r.value,
                }))
            }
            Ok((Message::Response(r), t)) if t == tag => Err(ControlError::Refused {
                addr,
                status: r.status,
            }),
            Ok((other, t)) => Err(ControlError::Protocol {
                addr,
                what: format!("{} with tag {t}", other.opcode()),
            }),
            Err(e) => Err(ControlError::Protocol {
                addr,
                what: e.to_string(),
            }),
        }
    }

    /// Sends one device request and waits for its response.
    pub fn request(&mut self, req: &request::Repr<'_>) -> Result<Response, ControlError> {
        let addr = self.addr.clone();
        let (tag, frame) = self.exchange(&Message::Request(*req))?;
        match proto::parse_frame(&frame) {
            Ok((Message::Response(r), t)) if t == tag => Ok(Response {
                status: r.status,
                value: r.value,
                data: r.payload.to_vec(),
            }),
            Ok((other, t)) => Err(ControlError::Protocol {
                addr,
                what: format!("{} with tag {t}", other.opcode()),
            }),
            Err(e) => Err(ControlError::Protocol {
                addr,
                what: e.to_string(),
            }),
        }
    }

    /// Whether the device closed the connection (or it broke): looks
    /// without waiting.
    pub fn is_closed(&mut self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut probe = [0u8; 1];
        let closed = match self.stream.peek(&mut probe) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        closed || self.stream.set_nonblocking(false).is_err()
    }

    /// Sends `message` and reads the next frame.
    fn exchange(&mut self, message: &Message<'_>) -> Result<(u64, Vec<u8>), ControlError> {
        let addr = self.addr.clone();
        let tag = self.send(message).map_err(|e| match e {
            Sent::Io(source) => ControlError::Io {
                addr: addr.clone(),
                source,
            },
            Sent::Encode(what) => ControlError::Protocol {
                addr: addr.clone(),
                what,
            },
        })?;
        let frame = self
            .recv()
            .map_err(|source| ControlError::Io { addr, source })?;
        Ok((tag, frame))
    }

    fn send(&mut self, message: &Message<'_>) -> Result<u64, Sent> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let bytes = message
            .encode_to_vec(tag)
            .map_err(|e| Sent::Encode(e.to_string()))?;
        self.stream.write_all(&bytes).map_err(Sent::Io)?;
        Ok(tag)
    }

    /// The next complete frame.
    fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        let invalid = |e: proto::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let mut buf = [0u8; 4096];
        loop {
            if let Some(frame) = self.frames.pop_front() {
                return Ok(frame);
            }
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let mut data = &buf[..n];
            // Feed and drain in turns: a full decoder takes bytes again only
            // after its complete frames are out.
            loop {
                let taken = self.decoder.feed(data).map_err(invalid)?;
                data = &data[taken..];
                while let Some(frame) = self.decoder.next_frame().map_err(invalid)? {
                    self.frames.push_back(frame.to_vec());
                }
                if data.is_empty() {
                    break;
                }
            }
        }
    }
}

/// Why a frame was not sent.
enum Sent {
    Io(std::io::Error),
    Encode(String),
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use proto::hello;
    use proto::{Opcode, PROTOCOL_VERSION};

    use super::*;

    /// A fake device port: answers HELLO as `F`, then QP_CONNECT with
    /// `answer(tag, end)`; returns the QP_CONNECT it received.
    fn fake_device(
        answer: fn(u64, Endpoint) -> Vec<u8>,
    ) -> (SocketAddr, std::thread::JoinHandle<Connect>) {
        fake_device_with(Capabilities::PIPELINING, answer)
    }

    /// [`fake_device`] whose HELLO says `capabilities`.
    fn fake_device_with(
        capabilities: Capabilities,
        answer: fn(u64, Endpoint) -> Vec<u8>,
    ) -> (SocketAddr, std::thread::JoinHandle<Connect>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = listener.local_addr().expect("address");
        let device = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut peer = Control {
                stream,
                decoder: FrameDecoder::new(),
                frames: VecDeque::new(),
                addr: String::new(),
                next_tag: 1,
                device: String::new(),
                map: None,
                capabilities: Capabilities::NONE,
            };
            let frame = peer.recv().expect("HELLO");
            let Ok((Message::Hello(h), tag)) = proto::parse_frame(&frame) else {
                panic!("not a HELLO");
            };
            assert_eq!(h.name, "c0");
            let hello = Message::Hello(hello::Repr {
                version: PROTOCOL_VERSION,
                role: Role::FabricDevice,
                capabilities,
                name: "F",
            });
            let bytes = hello.encode_to_vec(tag).expect("encode");
            peer.stream.write_all(&bytes).expect("send HELLO");
            let frame = peer.recv().expect("QP_CONNECT");
            let Ok((Message::QpConnect(connect), tag)) = proto::parse_frame(&frame) else {
                panic!("not a QP_CONNECT");
            };
            peer.stream
                .write_all(&answer(tag, connect.endpoint))
                .expect("answer");
            connect
        });
        (addr, device)
    }

    const END: Endpoint = Endpoint {
        qpn: 0x11,
        psn: 0xABCDE,
        ip: Ipv4Addr::new(10, 77, 0, 2),
        mtu: 1024,
    };
    const CONNECT: Connect = Connect {
        endpoint: END,
        atomics: Some(proto::qp::AtomicSeq { lane: 1, first: 77 }),
        epoch: None,
    };

    #[test]
    fn hello_then_qp_connect_returns_the_devices_end_and_rkeys() {
        let (addr, device) = fake_device(|tag, end| {
            let table = proto::qp::encode_rkeys(&[(0, 0xAB), (1, 0xCD)]);
            let accept = proto::qp::Accept::new(
                Endpoint {
                    qpn: 0x100,
                    psn: 7,
                    ip: Ipv4Addr::new(10, 77, 0, 101),
                    mtu: end.mtu,
                },
                &table,
            )
            .expect("accept");
            Message::QpAccept(accept)
                .encode_to_vec(tag)
                .expect("encode")
        });
        let mut control =
            Control::connect(addr, "c0", None, Duration::from_secs(5)).expect("connect");
        assert_eq!(control.device, "F");
        let accept = control.qp_connect(CONNECT).expect("QP_ACCEPT");
        assert_eq!(device.join().expect("device"), CONNECT);
        assert_eq!(accept.endpoint.qpn, 0x100);
        assert_eq!(accept.endpoint.ip, Ipv4Addr::new(10, 77, 0, 101));
        assert_eq!(accept.rkeys, HashMap::from([(0, 0xAB), (1, 0xCD)]));
    }

    #[test]
    fn a_refused_qp_connect_names_the_status() {
        let (addr, device) = fake_device(|tag, _| {
            proto::error_reply(Opcode::QpConnect, tag, Status::UnknownClient).to_vec()
        });
        let mut control =
            Control::connect(addr, "c0", None, Duration::from_secs(5)).expect("connect");
        let err = control.qp_connect(CONNECT).expect_err("refused");
        device.join().expect("device");
        assert!(
            matches!(
                err,
                ControlError::Refused {
                    status: Status::UnknownClient,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn the_epoch_is_said_only_to_a_device_that_takes_it() {
        let accept = |tag, end: Endpoint| {
            let table = proto::qp::encode_rkeys(&[]);
            let accept = proto::qp::Accept::new(end, &table).expect("accept");
            Message::QpAccept(accept)
                .encode_to_vec(tag)
                .expect("encode")
        };
        let (addr, device) = fake_device_with(Capabilities::QP_EPOCH, accept);
        let mut control =
            Control::connect(addr, "c0", None, Duration::from_secs(5)).expect("connect");
        assert_eq!(control.epoch_to_say(0), None, "a client on a file");
        let epoch = control.epoch_to_say(7);
        assert_eq!(epoch, Some(7));
        control
            .qp_connect(Connect { epoch, ..CONNECT })
            .expect("QP_ACCEPT");
        assert_eq!(device.join().expect("device").epoch, Some(7));

        let (addr, device) = fake_device_with(Capabilities::PIPELINING, accept);
        let mut control =
            Control::connect(addr, "c0", None, Duration::from_secs(5)).expect("connect");
        let epoch = control.epoch_to_say(7);
        assert_eq!(epoch, None, "an older device refuses the longer body");
        control
            .qp_connect(Connect { epoch, ..CONNECT })
            .expect("QP_ACCEPT");
        assert_eq!(device.join().expect("device").epoch, None);
    }

    #[test]
    fn a_device_on_a_newer_epoch_refuses_the_queue_pair_and_says_its_epoch() {
        let (addr, device) = fake_device_with(Capabilities::QP_EPOCH, |tag, _| {
            proto::fence::epoch_reply(Opcode::QpConnect, tag, Status::StaleMap, 9).to_vec()
        });
        let mut control =
            Control::connect(addr, "c0", None, Duration::from_secs(5)).expect("connect");
        let connect = Connect {
            epoch: control.epoch_to_say(8),
            ..CONNECT
        };
        let err = control.qp_connect(connect).expect_err("refused");
        device.join().expect("device");
        assert!(
            matches!(
                err,
                ControlError::Connect(ConnectError::NewerMap {
                    ours: 8,
                    theirs: 9,
                    ..
                })
            ),
            "{err:?}"
        );
    }
}
