//! The lab's one blocking raw-protocol client: a TCP connection straight to
//! a PMEM server, opened as a client with its key, the region's key learnt
//! from the server's MAP, then one request at a time, each reply read whole
//! and matched to its tag. A dead peer is an error, never a panic, so a
//! power cut in the middle of a request shows as one.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use proto::request::{Repr, Target};
use proto::{AccessKey, Message, RegionIndex, RegionOffset, Status, frame};

use crate::bench::client::BenchConn;

/// The largest reply body read; a longer one is an error.
const MAX_REPLY_BODY: usize = 16 << 20;

/// A server's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Its status.
    pub status: Status,
    /// Its value (an atomic's old value).
    pub value: u64,
    /// Its data (a READ's bytes).
    pub data: Vec<u8>,
}

impl Answer {
    /// `Ok(self)` when the status is OK, else an error naming `what`.
    pub fn ok(self, what: &str) -> io::Result<Answer> {
        if self.status == Status::Ok {
            Ok(self)
        } else {
            Err(io::Error::other(format!("{what} answered {}", self.status)))
        }
    }
}

/// How long connecting and each read or write may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// The TCP connect.
    pub connect: Duration,
    /// Each read and each write.
    pub io: Duration,
}

/// A blocking connection to one region of one PMEM server.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    region: RegionIndex,
    key: AccessKey,
    tag: u64,
    buf: Vec<u8>,
}

impl RawClient {
    /// Connects to the server at `addr`, proves `client`'s `secret` and
    /// learns `region`'s key from the server's MAP ([`AccessKey::NONE`]
    /// when the MAP gives none; see [`key`](Self::key)).
    pub fn connect(
        addr: SocketAddr,
        client: &str,
        secret: [u8; 32],
        region: RegionIndex,
        timeouts: Timeouts,
    ) -> io::Result<RawClient> {
        let stream = TcpStream::connect_timeout(&addr, timeouts.connect)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeouts.io))?;
        stream.set_write_timeout(Some(timeouts.io))?;
        let stream = BenchConn::open_stream(stream, client, Some(secret))?;
        let mut raw = RawClient {
            stream,
            region,
            key: AccessKey::NONE,
            tag: 0,
            buf: Vec::new(),
        };
        raw.exchange(&Message::MapRequest)?;
        raw.key = match proto::parse_frame(&raw.buf) {
            Ok((Message::Map(map), tag)) if tag == raw.tag => map.key(region),
            other => return Err(invalid(format!("expected a MAP: {other:?}"))),
        };
        Ok(raw)
    }

    /// The region's key from the MAP ([`AccessKey::NONE`] when it gave none).
    pub fn key(&self) -> AccessKey {
        self.key
    }

    /// `offset` in the region.
    pub fn at(&self, offset: u64) -> Target {
        Target::Region(RegionOffset::new(self.region, offset))
    }

    /// The connection (to shut it down from another thread).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends `request` and reads its answer.
    pub fn call(&mut self, request: Repr<'_>) -> io::Result<Answer> {
        self.call_timed(request).map(|(answer, _)| answer)
    }

    /// [`call`](Self::call), with the time from sending the request to
    /// having read the whole reply (its decoding not counted).
    pub fn call_timed(&mut self, request: Repr<'_>) -> io::Result<(Answer, Duration)> {
        let started = Instant::now();
        self.exchange(&Message::Request(request))?;
        let took = started.elapsed();
        match proto::parse_frame(&self.buf) {
            Ok((Message::Response(r), tag)) if tag == self.tag => Ok((
                Answer {
                    status: r.status,
                    value: r.value,
                    data: r.payload.to_vec(),
                },
                took,
            )),
            other => Err(invalid(format!("unexpected reply: {other:?}"))),
        }
    }

    /// Sends `message` with the next tag and reads one whole frame into
    /// the buffer.
    fn exchange(&mut self, message: &Message<'_>) -> io::Result<()> {
        self.tag += 1;
        let bytes = message
            .encode_to_vec(self.tag)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&bytes)?;
        self.buf.clear();
        self.buf.resize(frame::HEADER_LEN, 0);
        self.stream.read_exact(&mut self.buf)?;
        let body = frame::Packet::new_unchecked(&self.buf[..]).body_len() as usize;
        if body > MAX_REPLY_BODY {
            return Err(invalid(format!("oversized reply ({body} bytes)")));
        }
        self.buf.resize(frame::HEADER_LEN + body, 0);
        self.stream.read_exact(&mut self.buf[frame::HEADER_LEN..])
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}
