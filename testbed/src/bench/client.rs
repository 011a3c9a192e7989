//! A lean benchmark client: raw protocol frames over a blocking socket, with
//! reused buffers, so a measurement sees the daemons' data path and not a
//! client library.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use proto::decoder::{ReadError, ReadOutcome};
use proto::hello::{Capabilities, Role};
use proto::request::{Repr, Target};
use proto::{AccessKey, FrameDecoder, Message, RegionIndex, Status};

use super::waiting::Waiting;
use crate::report::LatencyHistogram;

/// One request shape, repeated.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The operation.
    pub op: BenchOp,
    /// Where (PMEM address; the device or server resolves it).
    pub target: Target,
    /// The region's key.
    pub key: AccessKey,
    /// Bytes read or written.
    pub size: u32,
    /// Bytes from `target` over which a connection's successive requests
    /// walk, `size` further each time and back to `target` at the end
    /// (0 or at most `size`: every request at `target`).
    pub spread: u64,
    /// Whether writes ask the server for non-temporal stores (the
    /// request's NON_TEMPORAL flag).
    pub non_temporal: bool,
}

impl Shape {
    /// `op` of `size` bytes at `target` with `key`, every request at the
    /// same place, no NON_TEMPORAL flag.
    pub fn new(op: BenchOp, target: Target, key: AccessKey, size: u32) -> Self {
        Self {
            op,
            target,
            key,
            size,
            spread: 0,
            non_temporal: false,
        }
    }

    /// The target of the `n`th request of a connection (see
    /// [`Shape::spread`]).
    fn target_of(&self, n: u64) -> Target {
        let size = u64::from(self.size).max(1);
        let slots = self.spread / size;
        let offset = if slots > 1 { n % slots * size } else { 0 };
        match self.target {
            Target::Pmem(addr) => Target::Pmem(addr + offset),
            Target::Region(at) => Target::Region(proto::RegionOffset {
                offset: at.offset + offset,
                ..at
            }),
        }
    }
}

/// The operations the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchOp {
    /// READ.
    Read,
    /// WRITE.
    Write,
    /// WRITE_PERSIST.
    WritePersist,
    /// COMPARE_SWAP (always fails to swap: compares against a value never stored).
    CompareSwap,
    /// FETCH_ADD of 1.
    FetchAdd,
}

impl BenchOp {
    /// The protocol name.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::Read => "READ",
            BenchOp::Write => "WRITE",
            BenchOp::WritePersist => "WRITE_PERSIST",
            BenchOp::CompareSwap => "COMPARE_SWAP",
            BenchOp::FetchAdd => "FETCH_ADD",
        }
    }
}

/// A connection to a fabric device (after HELLO) or straight to a server.
#[derive(Debug)]
pub struct BenchConn {
    stream: TcpStream,
    decoder: FrameDecoder,
    frame: Vec<u8>,
    next_tag: u64,
    /// Requests encoded so far (where [`Shape::spread`] walks to).
    sent: u64,
    /// How a receive waits for the peer's bytes.
    waiting: Waiting,
}

/// How long a receive waits for the peer, sleeping or spinning.
const RECV_TIMEOUT: Duration = Duration::from_secs(10);

fn other(what: String) -> io::Error {
    io::Error::other(what)
}

impl BenchConn {
    /// Connects; opens the connection as `client` when given (fabric
    /// devices need it), else talks to a server straight away.
    pub fn connect(addr: SocketAddr, client: Option<&str>) -> io::Result<Self> {
        if let Some(name) = client {
            return Self::open(addr, name, None);
        }
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(RECV_TIMEOUT))?;
        Ok(Self {
            stream,
            decoder: FrameDecoder::new(),
            frame: Vec::with_capacity(2 << 20),
            next_tag: 1,
            sent: 0,
            waiting: Waiting::Sleep,
        })
    }

    /// Connects to a fabric device and opens the connection as `client`
    /// with the project's opening (HELLO, and with `key` the challenge and
    /// proofs both ways).
    pub fn open(addr: SocketAddr, client: &str, key: Option<[u8; 32]>) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(RECV_TIMEOUT))?;
        Self::opened(stream, client, key)
    }

    /// Opens `stream`, already connected, as `client` (see
    /// [`BenchConn::open`]) and hands it back, for callers that frame
    /// their own requests. The peer sends nothing after the opening, so
    /// no byte is left behind.
    pub fn open_stream(
        stream: TcpStream,
        client: &str,
        key: Option<[u8; 32]>,
    ) -> io::Result<TcpStream> {
        Self::opened(stream, client, key).map(|conn| conn.stream)
    }

    fn opened(stream: TcpStream, client: &str, key: Option<[u8; 32]>) -> io::Result<Self> {
        use proto::opening::{Credentials, Opening, OpeningTags, Progress};
        let mut conn = Self {
            stream,
            decoder: FrameDecoder::new(),
            frame: Vec::with_capacity(2 << 20),
            next_tag: 3,
            sent: 0,
            waiting: Waiting::Sleep,
        };
        let credentials = match key {
            Some(key) => {
                let mut nonce = [0u8; proto::auth::NONCE_LEN];
                getrandom::fill(&mut nonce).map_err(|e| other(e.to_string()))?;
                Some(Credentials {
                    key: proto::auth::Key::new(key),
                    nonce,
                })
            }
            None => None,
        };
        let mut out = Vec::new();
        let mut opening = Opening::start(
            Role::Client,
            Capabilities::PIPELINING,
            client,
            false,
            OpeningTags::CLIENT,
            credentials,
            &mut out,
        )
        .map_err(|e| other(e.to_string()))?;
        loop {
            conn.stream.write_all(&out)?;
            out.clear();
            let frame = conn.next_frame()?;
            match opening
                .handle_frame(&frame, &mut out)
                .map_err(|e| other(format!("opening as {client}: {e}")))?
            {
                Progress::Waiting => {}
                Progress::Opened(_) => return Ok(conn),
            }
        }
    }

    /// Makes the connection's receives wait as `waiting` says.
    pub fn set_waiting(&mut self, waiting: Waiting) -> io::Result<()> {
        self.stream.set_nonblocking(waiting == Waiting::Spin)?;
        self.waiting = waiting;
        Ok(())
    }

    /// The key of region `index`, from the peer's MAP (servers make the
    /// keys; a device gives those its client may use).
    pub fn region_key(&mut self, index: RegionIndex) -> io::Result<AccessKey> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let request = Message::MapRequest
            .encode_to_vec(tag)
            .map_err(|e| other(e.to_string()))?;
        self.stream.write_all(&request)?;
        let frame = self.next_frame()?;
        let key = match proto::parse_frame(&frame).map_err(|e| other(e.to_string()))? {
            (Message::Map(map), t) if t == tag => map.key(index),
            (other_message, _) => {
                return Err(other(format!(
                    "expected MAP, got {}",
                    other_message.opcode()
                )));
            }
        };
        match key {
            AccessKey::NONE => Err(other(format!("no key for region {} in the MAP", index.0))),
            key => Ok(key),
        }
    }

    /// The next whole frame from the peer.
    fn next_frame(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| other(e.to_string()))?
            {
                return Ok(frame.to_vec());
            }
            self.fill()?;
        }
    }

    /// Reads what the peer sent into the decoder: a blocking read, or
    /// with [`Waiting::Spin`] non-blocking reads until bytes come.
    fn fill(&mut self) -> io::Result<()> {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.decoder.read_from(&mut self.stream, 4 << 20) {
                Ok(ReadOutcome::Data(_) | ReadOutcome::Full) => return Ok(()),
                Ok(ReadOutcome::Eof) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Err(ReadError::Io(e))
                    if e.kind() == io::ErrorKind::WouldBlock && self.waiting == Waiting::Spin =>
                {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) && started.elapsed() > RECV_TIMEOUT {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no response within {RECV_TIMEOUT:?} (spinning)"),
                        ));
                    }
                    std::hint::spin_loop();
                }
                Err(ReadError::Io(e)) => return Err(e),
                Err(ReadError::Framing(e)) => return Err(other(e.to_string())),
            }
        }
    }

    /// Encodes a request of `shape` (payload from `data`) into the send
    /// buffer.
    fn encode(&mut self, shape: &Shape, data: &[u8]) -> io::Result<()> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let payload = &data[..shape.size as usize];
        let target = shape.target_of(self.sent);
        self.sent += 1;
        let mut repr = match shape.op {
            BenchOp::Read => Repr::read(target, shape.key, shape.size),
            BenchOp::Write => Repr::write(target, shape.key, payload),
            BenchOp::WritePersist => Repr::write_persist(target, shape.key, payload),
            BenchOp::CompareSwap => Repr::compare_swap(target, shape.key, u64::MAX, 1),
            BenchOp::FetchAdd => Repr::fetch_add(target, shape.key, 1),
        };
        if shape.non_temporal {
            repr = repr.with_non_temporal();
        }
        Message::Request(repr)
            .encode_into(tag, &mut self.frame)
            .map_err(|e| other(e.to_string()))
    }

    /// Sends `count` requests of `shape` in one write.
    pub fn send(&mut self, shape: &Shape, data: &[u8], count: usize) -> io::Result<()> {
        self.frame.clear();
        for _ in 0..count {
            self.encode(shape, data)?;
        }
        self.stream.write_all(&self.frame)
    }

    /// Receives one response; returns its opcode and status.
    fn recv_one(&mut self) -> io::Result<(proto::Opcode, Status)> {
        loop {
            if let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| other(e.to_string()))?
            {
                let (message, _) = proto::parse_frame(frame).map_err(|e| other(e.to_string()))?;
                let status = match &message {
                    Message::Response(r) => r.status,
                    _ => Status::Ok,
                };
                return Ok((message.opcode(), status));
            }
            self.fill()?;
        }
    }

    /// Receives one response and fails unless it is OK.
    pub fn recv_ok(&mut self) -> io::Result<()> {
        match self.recv_one()? {
            (_, Status::Ok) => Ok(()),
            (_, status) => Err(other(format!("request failed: {status}"))),
        }
    }
}

/// Round trips at queue depth 1: `warmup` unrecorded, then requests until
/// `duration` passes or `max` were recorded.
pub fn latency(
    conn: &mut BenchConn,
    shape: &Shape,
    warmup: usize,
    duration: Duration,
    max: usize,
) -> io::Result<LatencyHistogram> {
    let data = vec![0x5a; shape.size as usize];
    for _ in 0..warmup {
        conn.send(shape, &data, 1)?;
        conn.recv_ok()?;
    }
    let mut histogram = LatencyHistogram::new();
    let deadline = Instant::now() + duration;
    while (histogram.count() as usize) < max && Instant::now() < deadline {
        let started = Instant::now();
        conn.send(shape, &data, 1)?;
        conn.recv_ok()?;
        histogram.record_duration(started.elapsed());
    }
    Ok(histogram)
}

/// How a pipelining client keeps `depth` requests going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipelining {
    /// `depth` requests go out in one write, all `depth` responses are read,
    /// then the next batch follows: what `redis-benchmark -P depth` does, so
    /// the 64 B throughput figures compare like with like.
    Batches,
    /// A sliding window: whenever half of `depth` have completed, that many
    /// new requests go out in one write, so the pipe never drains (what a
    /// bulk transfer does; the bandwidth figures use it against iperf3's
    /// continuous stream).
    Window,
}

/// Completed operations and the time they took, with `depth` requests in
/// flight on `conn` for `duration`, pipelined as `how` says.
pub fn pipelined(
    conn: &mut BenchConn,
    shape: &Shape,
    depth: usize,
    how: Pipelining,
    duration: Duration,
) -> io::Result<(u64, Duration)> {
    let started = Instant::now();
    pipelined_while(conn, shape, depth, how, &|| started.elapsed() < duration)
}

/// [`pipelined`] for as long as `go_on` says yes (asked before each batch
/// or refill).
pub fn pipelined_while(
    conn: &mut BenchConn,
    shape: &Shape,
    depth: usize,
    how: Pipelining,
    go_on: &dyn Fn() -> bool,
) -> io::Result<(u64, Duration)> {
    let data = vec![0x5a; shape.size as usize];
    let depth = depth.max(1);
    let started = Instant::now();
    let completed = match how {
        Pipelining::Batches => {
            let mut completed = 0u64;
            while go_on() {
                conn.send(shape, &data, depth)?;
                for _ in 0..depth {
                    conn.recv_ok()?;
                }
                completed += depth as u64;
            }
            completed
        }
        Pipelining::Window => window(conn, shape, &data, depth, go_on)?,
    };
    Ok((completed, started.elapsed()))
}

/// [`Pipelining::Window`] while `go_on` says yes; returns the completed
/// count.
fn window(
    conn: &mut BenchConn,
    shape: &Shape,
    data: &[u8],
    depth: usize,
    go_on: &dyn Fn() -> bool,
) -> io::Result<u64> {
    conn.send(shape, data, depth)?;
    let mut outstanding = depth;
    let mut completed = 0u64;
    let refill = (depth / 2).max(1);
    let mut done_since_refill = 0;
    while outstanding > 0 {
        conn.recv_ok()?;
        outstanding -= 1;
        completed += 1;
        done_since_refill += 1;
        if done_since_refill >= refill && go_on() {
            conn.send(shape, data, done_since_refill)?;
            outstanding += done_since_refill;
            done_since_refill = 0;
        }
    }
    Ok(completed)
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use proto::PmemAddr;

    use super::*;

    /// The requests `send` puts on the wire for `shape`, `count` of them,
    /// as the peer parses them: (target, NON_TEMPORAL flag).
    fn on_the_wire(shape: &Shape, count: usize) -> Vec<(Target, bool)> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("address");
        let mut conn = BenchConn::connect(addr, None).expect("connect");
        let (mut peer, _) = listener.accept().expect("accept");
        conn.send(shape, &vec![1u8; shape.size as usize], count)
            .expect("send");
        drop(conn);
        let mut bytes = Vec::new();
        peer.read_to_end(&mut bytes).expect("read what was sent");
        let mut decoder = FrameDecoder::new();
        decoder.feed(&bytes).expect("frames");
        let mut seen = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("a whole frame") {
            match proto::parse_frame(frame).expect("a valid frame") {
                (Message::Request(r), _) => seen.push((r.target, r.non_temporal)),
                (other, _) => panic!("expected a request, got {}", other.opcode()),
            }
        }
        seen
    }

    fn write(size: u32) -> Shape {
        Shape::new(
            BenchOp::Write,
            Target::Pmem(PmemAddr(1 << 40)),
            AccessKey(7),
            size,
        )
    }

    #[test]
    fn the_non_temporal_flag_goes_on_the_wire_when_the_shape_asks() {
        let plain = on_the_wire(&write(64), 2);
        assert_eq!(plain.len(), 2);
        assert!(plain.iter().all(|(_, nt)| !nt), "{plain:?}");
        let bulk = Shape {
            non_temporal: true,
            ..write(4096)
        };
        let streamed = on_the_wire(&bulk, 2);
        assert_eq!(streamed.len(), 2);
        assert!(streamed.iter().all(|(_, nt)| *nt), "{streamed:?}");
    }

    #[test]
    fn a_spread_walks_the_range_and_wraps() {
        let base = 1u64 << 40;
        let walking = Shape {
            spread: 3 * 64,
            ..write(64)
        };
        let targets: Vec<u64> = on_the_wire(&walking, 5)
            .into_iter()
            .map(|(t, _)| match t {
                Target::Pmem(a) => a.0 - base,
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(targets, [0, 64, 128, 0, 64]);
        let fixed: Vec<Target> = on_the_wire(&write(64), 3)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(fixed, [Target::Pmem(PmemAddr(base)); 3]);
    }
}
