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
use std::time::Duration;

use proto::FrameDecoder;
use proto::decoder::{ReadError, ReadOutcome};

use crate::exec::{Executor, Flow};
use crate::gate::Session;

/// Most bytes read from the socket at a time.
const READ_CHUNK: usize = 256 * 1024;
/// Replies are written out once this many bytes are pending.
pub const OUT_FLUSH_BYTES: usize = 1 << 20;
/// How often a blocked read wakes up to check for shutdown.
pub const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

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
    /// The socket failed.
    Io(io::Error),
}

/// Serves one connection until the peer leaves, the stream breaks or
/// `shutdown` is set. Frames already received when shutdown starts are still
/// executed and answered.
pub fn serve(mut stream: TcpStream, exec: &Executor, shutdown: &Arc<AtomicBool>) -> ConnectionEnd {
    if let Err(e) = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(SHUTDOWN_POLL)))
    {
        return ConnectionEnd::Io(e);
    }
    let mut decoder = FrameDecoder::new();
    let mut out = Vec::with_capacity(64 * 1024);
    let mut session = exec.new_session();
    loop {
        if shutdown.load(Ordering::Relaxed) {
            return ConnectionEnd::Shutdown;
        }
        // Bytes go from the socket straight into the decoder's buffer.
        let read = decoder.read_from(&mut stream, READ_CHUNK);
        let broken = match read {
            Ok(ReadOutcome::Data(_) | ReadOutcome::Full) => None,
            Ok(ReadOutcome::Eof) => Some(ConnectionEnd::PeerClosed),
            Err(ReadError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(ReadError::Io(e)) => Some(ConnectionEnd::Io(e)),
            Err(ReadError::Framing(e)) => Some(ConnectionEnd::Malformed(e)),
        };
        // Frames completed before a hang-up or a bad header are still answered.
        let drained = drain(&mut decoder, exec, &mut session, &mut stream, &mut out);
        let end = match drained {
            Ok(None) => broken,
            Ok(Some(Stop::Malformed(e))) => Some(ConnectionEnd::Malformed(e)),
            Ok(Some(Stop::Refused)) => Some(ConnectionEnd::Refused),
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

/// Executes every complete frame the decoder holds. Returns why it stopped
/// early, if it did.
fn drain(
    decoder: &mut FrameDecoder,
    exec: &Executor,
    session: &mut Session,
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
) -> io::Result<Option<Stop>> {
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => {
                match exec.handle_frame(session, frame, out) {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Close) => return Ok(Some(Stop::Refused)),
                    Err(e) => return Ok(Some(Stop::Malformed(e))),
                }
                if out.len() >= OUT_FLUSH_BYTES {
                    stream.write_all(out)?;
                    out.clear();
                }
            }
            Ok(None) => return Ok(None),
            Err(e) => return Ok(Some(Stop::Malformed(e))),
        }
    }
}
