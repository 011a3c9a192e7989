//! A raw protocol client over a blocking TCP stream, and helpers to address
//! regions and check region files.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use proto::hello::{self, Capabilities, Role};
use proto::request::{self, Target};
use proto::{AccessKey, FrameDecoder, Message, Opcode, Status, map};
use topology::{EnvOverrides, Layout, RegionIndex, RegionOffset, Topology};

/// The protocol version [`Conn::hello`] announces.
pub use proto::PROTOCOL_VERSION;
/// How long a [`Conn`] waits to connect or for a reply before panicking.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Bytes before the data in a region file (pmem-server's header page).
pub const REGION_FILE_HEADER_LEN: u64 = 4096;

/// A decoded frame from the peer.
///
/// - Responses: their status, old value (atomics) and payload (READ data).
/// - HELLO: status OK, `value` the peer's capability bits, `data` its name.
/// - PING/PONG: status OK, `value` the echoed value, `data` the raw body.
/// - Anything else (MAP, requests): status OK, `value` 0 (MAP: the entry
///   count), `data` the raw frame body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The frame's opcode.
    pub opcode: Opcode,
    /// The frame's tag.
    pub tag: u64,
    /// The response status; OK for frames that are not responses.
    pub status: Status,
    /// See the type's documentation.
    pub value: u64,
    /// See the type's documentation.
    pub data: Vec<u8>,
}

impl Reply {
    /// The reply held in one complete frame.
    ///
    /// # Panics
    ///
    /// When the frame does not parse: the peer broke the protocol.
    fn from_frame(frame: &[u8]) -> Reply {
        let (message, tag) = proto::parse_frame(frame)
            .unwrap_or_else(|e| panic!("the peer sent a frame that does not parse: {e}"));
        let body = frame.get(proto::frame::HEADER_LEN..).unwrap_or_default();
        let opcode = message.opcode();
        let (status, value, data) = match message {
            Message::Response(r) => (r.status, r.value, r.payload.to_vec()),
            Message::Hello(h) => (
                Status::Ok,
                h.capabilities.bits(),
                h.name.as_bytes().to_vec(),
            ),
            Message::Ping(v) | Message::Pong(v) | Message::MapEpoch(v) => {
                (Status::Ok, v, body.to_vec())
            }
            Message::Map(m) => (Status::Ok, m.entries.len() as u64, body.to_vec()),
            Message::Request(_)
            | Message::MapRequest
            | Message::QpConnect(_)
            | Message::QpAccept(_)
            | Message::AuthChallenge(_)
            | Message::AuthProof(_)
            | Message::RotateKey(_)
            | Message::Scrub(_)
            | Message::ScrubReport(_)
            | Message::BlockSums(_)
            | Message::BlockSumsReport(_) => (Status::Ok, 0, body.to_vec()),
        };
        Reply {
            opcode,
            tag,
            status,
            value,
            data,
        }
    }
}

/// A raw protocol connection to a daemon: send frames with fresh tags,
/// receive and decode what comes back.
///
/// Every method panics on I/O errors and protocol violations, except
/// [`Conn::connect_timeout`] (which returns the error) and
/// [`Conn::try_recv`] (which returns `None` when the peer closes or resets
/// the connection).
#[derive(Debug)]
pub struct Conn {
    /// The socket, for tests that poke at it directly.
    pub stream: TcpStream,
    decoder: FrameDecoder,
    /// Complete frames received but not yet handed out.
    frames: VecDeque<Vec<u8>>,
    next_tag: u64,
}

impl Conn {
    /// Connects to `addr`.
    ///
    /// # Panics
    ///
    /// When the connection fails.
    pub fn connect(addr: SocketAddr) -> Self {
        Self::connect_timeout(addr, IO_TIMEOUT).unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
    }

    /// Connects to `addr`, giving up after `timeout`; the error is returned
    /// for tests that expect the connection to fail.
    pub fn connect_timeout(addr: SocketAddr, timeout: Duration) -> std::io::Result<Self> {
        TcpStream::connect_timeout(&addr, timeout).map(Self::from_stream)
    }

    /// Wraps a connected stream: no Nagle delay, reads time out after
    /// [`IO_TIMEOUT`].
    pub fn from_stream(stream: TcpStream) -> Self {
        stream.set_nodelay(true).expect("set TCP_NODELAY");
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .expect("set the read timeout");
        Self {
            stream,
            decoder: FrameDecoder::new(),
            frames: VecDeque::new(),
            next_tag: 1,
        }
    }

    /// Sends a message with a fresh tag and returns the tag.
    pub fn send(&mut self, message: &Message<'_>) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        let bytes = message.encode_to_vec(tag).expect("encode the message");
        self.stream.write_all(&bytes).expect("send");
        tag
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send raw bytes");
    }

    /// The next complete frame; `None` when the peer closed or reset the
    /// connection.
    fn next_frame(&mut self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(frame) = self.frames.pop_front() {
                return Some(frame);
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    ) =>
                {
                    return None;
                }
                Err(e) => panic!("recv: {e}"),
            };
            let mut data = &buf[..n];
            // Feed and drain in turns: a full decoder takes bytes again only
            // after its complete frames are out.
            loop {
                let taken = self.decoder.feed(data).expect("the peer's framing");
                data = &data[taken..];
                while let Some(frame) = self.decoder.next_frame().expect("the peer's framing") {
                    self.frames.push_back(frame.to_vec());
                }
                if data.is_empty() {
                    break;
                }
            }
        }
    }

    /// Receives the next frame; `None` when the peer closed or reset the
    /// connection.
    pub fn try_recv(&mut self) -> Option<Reply> {
        self.next_frame().map(|frame| Reply::from_frame(&frame))
    }

    /// Receives the next frame.
    ///
    /// # Panics
    ///
    /// When the peer closes the connection instead.
    pub fn recv(&mut self) -> Reply {
        self.try_recv().expect("the peer closed the connection")
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, req: request::Repr<'_>) -> Reply {
        let tag = self.send(&Message::Request(req));
        self.reply_to(tag)
    }

    /// Receives the next frame and checks that it answers `tag`.
    fn reply_to(&mut self, tag: u64) -> Reply {
        let reply = self.recv();
        assert_eq!(reply.tag, tag, "reply to another request: {reply:?}");
        reply
    }

    /// Says HELLO as a client named `name`; the reply is the peer's HELLO
    /// (its name in `data`) or an error response.
    pub fn hello(&mut self, name: &str) -> Reply {
        self.hello_as(Role::Client, name)
    }

    /// Says HELLO in `role` as `name`; see [`Conn::hello`].
    pub fn hello_as(&mut self, role: Role, name: &str) -> Reply {
        let tag = self.send(&Message::Hello(hello::Repr {
            version: PROTOCOL_VERSION,
            role,
            capabilities: Capabilities::NONE,
            name,
        }));
        self.reply_to(tag)
    }

    /// Opens the connection as `name` in `role`, proving `key` (the
    /// principal's key bytes) with the protocol's own opening; the next
    /// tags are this connection's. `Err` carries why the peer refused or
    /// what went wrong.
    pub fn authenticate(
        &mut self,
        role: Role,
        name: &str,
        key: [u8; 32],
    ) -> Result<(), proto::opening::OpeningError> {
        use proto::opening::{Credentials, Opening, OpeningTags, Progress};
        let tags = OpeningTags {
            hello: self.next_tag,
            map: self.next_tag + 1,
        };
        self.next_tag += 2;
        let mut out = Vec::new();
        let credentials = Credentials {
            key: proto::auth::Key::new(key),
            nonce: [0x5A; proto::auth::NONCE_LEN],
        };
        let mut opening = Opening::start(
            role,
            Capabilities::NONE,
            name,
            false,
            tags,
            Some(credentials),
            &mut out,
        )
        .expect("encode the opening");
        loop {
            self.send_raw(&out);
            out.clear();
            let Some(frame) = self.next_frame() else {
                return Err(proto::opening::OpeningError::Refused(Status::IoError));
            };
            match opening.handle_frame(&frame, &mut out)? {
                Progress::Waiting => {}
                Progress::Opened(_) => return Ok(()),
            }
        }
    }

    /// The key of region `index`, from the peer's MAP (what this
    /// connection's principal is given).
    ///
    /// # Panics
    ///
    /// When the MAP gives no key for the region (or names no such region).
    pub fn region_key(&mut self, index: u32) -> AccessKey {
        let key = self.map().key(RegionIndex(index));
        assert!(!key.is_none(), "the MAP gives no key for region {index}");
        key
    }

    /// Asks for the address map and returns it.
    ///
    /// # Panics
    ///
    /// When the answer is not a MAP for this request.
    pub fn map(&mut self) -> map::Repr {
        let tag = self.send(&Message::MapRequest);
        let frame = self
            .next_frame()
            .expect("the peer closed the connection instead of sending its MAP");
        let (message, reply_tag) = proto::parse_frame(&frame)
            .unwrap_or_else(|e| panic!("the answer to MAP_REQUEST does not parse: {e}"));
        assert_eq!(reply_tag, tag, "reply to another request: {message:?}");
        match message {
            Message::Map(map) => map,
            other => panic!("expected MAP, got {other:?}"),
        }
    }
}

/// The region-addressed target of `offset` in region `index`.
pub fn at(index: u32, offset: u64) -> Target {
    Target::Region(RegionOffset::new(RegionIndex(index), offset))
}

/// The key of region `index`, as the server at `addr` gives it in its MAP
/// to a peer that does not authenticate (servers make their regions' keys;
/// a server without `--secrets` gives them to anyone).
///
/// # Panics
///
/// When the server cannot be reached or gives no key for the region.
pub fn key(addr: SocketAddr, index: u32) -> AccessKey {
    Conn::connect(addr).region_key(index)
}

/// The layout a topology file gives (no environment overrides).
pub fn layout(path: &Path) -> Layout {
    let topology = Topology::load_with(path, &EnvOverrides::None)
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    Layout::new(&topology).unwrap_or_else(|e| panic!("layout of {}: {e}", path.display()))
}

/// Reads `len` bytes at `offset` of a region's data straight from its file
/// `<data_dir>/<region>.pmem`.
pub fn file_bytes(data_dir: &Path, region: &str, offset: u64, len: usize) -> Vec<u8> {
    let path = data_dir.join(format!("{region}.pmem"));
    let file = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("open region file {}: {e}", path.display()));
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, REGION_FILE_HEADER_LEN + offset)
        .unwrap_or_else(|e| {
            panic!(
                "read {len} bytes at data offset {offset} of {}: {e}",
                path.display()
            )
        });
    bytes
}
