//! One data connection: read frames, execute them, write the replies.
//!
//! Requests are pipelined: everything a read brings in is executed and the
//! replies go back in one write. Memory per connection stays bounded: the
//! decoder never holds more than one maximal frame, and replies are written
//! out whenever they pass [`OUT_FLUSH_BYTES`].

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proto::FrameDecoder;
use proto::decoder::{ReadError, ReadOutcome};
use proto::fence::{self, ConnEpoch};

use crate::exec::{Executor, Flow};
use crate::gate::Session;
use crate::qp_fence::{Binding, HeldQp, Refusal};

/// Sets up RDMA queue pairs for the peers of one NIC (the `verbs` feature's
/// NICs implement it).
pub trait QueuePairs: Send + Sync {
    /// Answers a QP_CONNECT body: a queue pair, kept until the connection
    /// ends or a takeover fences it, and its QP_ACCEPT frame for `tag`; or
    /// the status refusing it.
    fn connect(
        &self,
        connect: &proto::qp::Connect,
        tag: u64,
    ) -> Result<(HeldQp, Vec<u8>), proto::Status>;
}

/// Most bytes read from the socket at a time.
const READ_CHUNK: usize = 256 * 1024;
/// Largest frame body taken from a peer that has not proven its key yet
/// (with `--secrets`; HELLO and the proof are far smaller), so an
/// unauthenticated peer cannot make the server hold large frames.
const PRE_PROOF_MAX_BODY: u32 = 4096;
/// Replies are written out once this many bytes are pending.
pub const OUT_FLUSH_BYTES: usize = 1 << 20;

/// How long a connection may stay silent before it is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From its accept until it proved its key (with authentication; without,
    /// until its first complete frame), so sockets that say nothing, or
    /// say HELLO and never prove it, do not hold connection slots.
    pub hello: Duration,
    /// Between frames after that (a server's connection has nothing in
    /// flight while it waits to read); `None`: never.
    pub idle: Option<Duration>,
}

impl Default for Timeouts {
    /// 10 s to the first frame; no idle limit (a fabric device's link may
    /// rightly stay quiet for long).
    fn default() -> Self {
        Self {
            hello: Duration::from_secs(10),
            idle: None,
        }
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub enum ConnectionEnd {
    /// The peer closed it.
    PeerClosed,
    /// The server is shutting down.
    Shutdown,
    /// The peer sent bytes that cannot be framed.
    Malformed(proto::Error),
    /// The peer did not prove its key (with `--secrets`).
    Refused,
    /// The peer proved its key, but may not stay: the proven connections'
    /// cap is reached, or it was evicted for a newer unproven one.
    NotAdmitted,
    /// The socket failed.
    Io(io::Error),
    /// The peer said nothing for too long: `hello_timeout` or `idle`.
    Silent(&'static str),
}

/// Serves one connection until the peer leaves, the stream breaks, the
/// peer stays silent past `timeouts`, or shutdown ends its reads (the
/// server shuts the socket's read side, which wakes a blocked read; see
/// `server`). Frames already received when shutdown starts are still
/// executed and answered. Once the peer proves its key, `promote` says
/// whether it may stay (see `live`).
pub fn serve(
    mut stream: TcpStream,
    exec: &Executor,
    shutdown: &Arc<AtomicBool>,
    timeouts: Timeouts,
    qps: Option<&dyn QueuePairs>,
    promote: &dyn Fn() -> bool,
) -> ConnectionEnd {
    if let Err(e) = stream.set_nodelay(true) {
        return ConnectionEnd::Io(e);
    }
    let settle_by = Instant::now() + timeouts.hello;
    let mut session = exec.new_session();
    // The map epoch the peer said it runs (fencing), until it says another.
    let mut said = ConnEpoch::default();
    // Without authentication nothing is to be proven.
    let mut proven = session.admits();
    let mut decoder = match session.admits() {
        true => FrameDecoder::new(),
        false => FrameDecoder::with_max_body_len(PRE_PROOF_MAX_BODY),
    };
    let mut out = Vec::with_capacity(64 * 1024);
    // Proven, and a frame executed: the idle timeout applies from then on.
    let mut settled = false;
    // Queue pairs set up on this connection live until it ends or a
    // takeover fences them.
    let mut link = QpLink {
        service: qps.map(|service| (service, exec.qp_fence().bind())),
        last_said: None,
    };
    loop {
        if shutdown.load(Ordering::Relaxed) {
            return ConnectionEnd::Shutdown;
        }
        // Until it settles (proven, or without authentication its first
        // frame) the peer has what is left of `timeouts.hello` in all, however
        // it spreads its bytes.
        if !settled {
            let left = settle_by.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return ConnectionEnd::Silent("hello_timeout");
            }
            if let Err(e) = stream.set_read_timeout(Some(left)) {
                return ConnectionEnd::Io(e);
            }
        }
        // Bytes go from the socket straight into the decoder's buffer.
        let read = decoder.read_from(&mut stream, READ_CHUNK);
        let broken = match read {
            Ok(ReadOutcome::Data(_) | ReadOutcome::Full) => None,
            Ok(ReadOutcome::Eof) if shutdown.load(Ordering::Relaxed) => {
                Some(ConnectionEnd::Shutdown)
            }
            Ok(ReadOutcome::Eof) => Some(ConnectionEnd::PeerClosed),
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(ReadError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return ConnectionEnd::Silent(if settled { "idle" } else { "hello_timeout" });
            }
            Err(ReadError::Io(e)) => Some(ConnectionEnd::Io(e)),
            Err(ReadError::Framing(e)) => Some(ConnectionEnd::Malformed(e)),
        };
        // Frames completed before a hang-up or a bad header are still answered.
        let drained = drain(
            &mut decoder,
            exec,
            &mut session,
            &mut said,
            &mut link,
            &mut stream,
            &mut out,
        );
        if !proven && session.admits() {
            if !promote() {
                return ConnectionEnd::NotAdmitted;
            }
            proven = true;
            decoder.raise_max_body_len(proto::frame::MAX_BODY_LEN);
        }
        let end = match drained {
            Ok((_, Some(Stop::Malformed(e)))) => Some(ConnectionEnd::Malformed(e)),
            Ok((_, Some(Stop::Refused))) => Some(ConnectionEnd::Refused),
            Ok((0, None)) => broken,
            Ok((_, None)) => {
                if proven && !settled {
                    settled = true;
                    if let Err(e) = stream.set_read_timeout(timeouts.idle) {
                        return ConnectionEnd::Io(e);
                    }
                }
                broken
            }
            Err(e) => return ConnectionEnd::Io(e),
        };
        if let Err(e) = stream.write_all(&out) {
            return ConnectionEnd::Io(e);
        }
        out.clear();
        if let Some(end) = end {
            return end;
        }
    }
}

/// Why draining stopped short.
enum Stop {
    /// The stream cannot be framed any more.
    Malformed(proto::Error),
    /// The peer was refused at the gate.
    Refused,
}

/// Executes every complete frame the decoder holds. Returns how many it
/// executed and why it stopped early, if it did.
fn drain(
    decoder: &mut FrameDecoder,
    exec: &Executor,
    session: &mut Session,
    said: &mut ConnEpoch,
    link: &mut QpLink<'_>,
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
) -> io::Result<(usize, Option<Stop>)> {
    let mut executed = 0;
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => {
                if link.answer(exec, session, *said, frame, out) {
                    executed += 1;
                    continue;
                }
                let result = exec.handle_frame_at(session, said, frame, out);
                link.note(*said);
                match result {
                    Ok(Flow::Continue) => executed += 1,
                    Ok(Flow::Close) => return Ok((executed, Some(Stop::Refused))),
                    Err(e) => return Ok((executed, Some(Stop::Malformed(e)))),
                }
                if out.len() >= OUT_FLUSH_BYTES {
                    stream.write_all(out)?;
                    out.clear();
                }
            }
            Ok(None) => return Ok((executed, None)),
            Err(e) => return Ok((executed, Some(Stop::Malformed(e)))),
        }
    }
}

/// Who sets up a connection's queue pairs, and its place in the fence
/// that holds them (`qp_fence`).
struct QpLink<'a> {
    service: Option<(&'a dyn QueuePairs, Binding)>,
    /// The epoch last told to the fence.
    last_said: Option<u64>,
}

impl QpLink<'_> {
    /// Answers `frame` if it is a QP_CONNECT this NIC serves, from a peer
    /// that may set up queue pairs (a proven fabric device, or anyone
    /// without authentication) on a connection that said `said`; false
    /// leaves it to the executor. A connection behind the server's epoch
    /// (or the fence's) is refused STALE_MAP with that epoch.
    fn answer(
        &mut self,
        exec: &Executor,
        session: &Session,
        said: ConnEpoch,
        frame: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        let Some((service, binding)) = &self.service else {
            return false;
        };
        let Ok((proto::Message::QpConnect(connect), tag)) = proto::parse_frame(frame) else {
            return false;
        };
        if !session.may_set_up_queue_pairs() {
            return false;
        }
        let device = match session {
            Session::ProvenDevice { device } => Some(device.as_str()),
            _ => None,
        };
        let epoch = connect.epoch.or(said.get());
        match binding.admit(device, epoch, exec.epoch(), || {
            service.connect(&connect, tag)
        }) {
            Ok(accept) => out.extend_from_slice(&accept),
            Err(Refusal::Stale { ours }) => {
                exec.metrics().stale_map.inc();
                tracing::info!(
                    "QP_CONNECT at map epoch {} refused STALE_MAP: this server fences queue \
                     pairs at epoch {ours}",
                    epoch.unwrap_or(0)
                );
                out.extend_from_slice(&fence::epoch_reply(
                    proto::Opcode::QpConnect,
                    tag,
                    proto::Status::StaleMap,
                    ours,
                ));
            }
            Err(Refusal::Failed(status)) => {
                out.extend_from_slice(&proto::error_reply(proto::Opcode::QpConnect, tag, status));
            }
        }
        true
    }

    /// Tells the fence the epoch the connection says, when it changed.
    fn note(&mut self, said: ConnEpoch) {
        if let Some((_, binding)) = &self.service
            && said.get() != self.last_said
        {
            self.last_said = said.get();
            binding.said(self.last_said);
        }
    }
}
