//! The opening played between a real connector ([`Opening`]) and the
//! executor's gate (the listener), each reading through a [`FrameDecoder`]
//! as a daemon does, with a wire between them that the fuzzer may tamper
//! with.

use arbitrary::Arbitrary;
use pmem_server::{Executor, Flow, Session};
use proto::FrameDecoder;
use proto::auth::{KEY_LEN, Key, NONCE_LEN};
use proto::hello::{Capabilities, Role};
use proto::opening::{Credentials, Opened, Opening, OpeningError, OpeningTags, Progress};

use crate::frames::{Piece, sent_frames};
use crate::scratch::{CLIENT_KEY, DEVICE_KEY, OPERATOR, OPERATOR_KEY};

/// Who connects to a gated server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Who {
    /// Fabric device `F` with its key.
    Device,
    /// Client `c` with its key.
    Client,
    /// The operator with its key.
    Operator,
    /// Device `F`'s name with another key.
    WrongKey,
    /// A device the server does not know, with `F`'s key.
    Stranger,
}

impl Who {
    /// The role, name and key the connector says and holds.
    pub fn credentials(self) -> (Role, &'static str, [u8; KEY_LEN]) {
        match self {
            Who::Device => (Role::FabricDevice, "F", DEVICE_KEY),
            Who::Client => (Role::Client, "c", CLIENT_KEY),
            Who::Operator => (Role::Admin, OPERATOR, OPERATOR_KEY),
            Who::WrongKey => (Role::FabricDevice, "F", [7; KEY_LEN]),
            Who::Stranger => (Role::FabricDevice, "G", DEVICE_KEY),
        }
    }

    /// Whether this connector holds the key of a principal the server knows.
    pub fn holds_a_known_key(self) -> bool {
        matches!(self, Who::Device | Who::Client | Who::Operator)
    }
}

/// What the wire does with one frame.
#[derive(Debug, Clone, Arbitrary)]
pub enum Tamper {
    /// Delivers it.
    Deliver,
    /// Loses it.
    Drop,
    /// Delivers it with one bit flipped (the position wraps).
    FlipBit {
        /// Byte position.
        at: u16,
        /// Bit in that byte.
        bit: u8,
    },
    /// Delivers only its first bytes.
    Truncate {
        /// How many.
        keep: u16,
    },
    /// Delivers these bytes first, then the frame.
    Before(Piece),
    /// Delivers these bytes instead.
    Replace(Piece),
}

impl Tamper {
    fn apply(&self, frame: &[u8], wire: &mut Vec<u8>) {
        match self {
            Tamper::Deliver => wire.extend_from_slice(frame),
            Tamper::Drop => {}
            Tamper::FlipBit { at, bit } => {
                let start = wire.len();
                wire.extend_from_slice(frame);
                if !frame.is_empty() {
                    wire[start + usize::from(*at) % frame.len()] ^= 1 << (bit % 8);
                }
            }
            Tamper::Truncate { keep } => {
                wire.extend_from_slice(&frame[..frame.len().min(usize::from(*keep))]);
            }
            Tamper::Before(piece) => {
                piece.append_to(wire);
                wire.extend_from_slice(frame);
            }
            Tamper::Replace(piece) => piece.append_to(wire),
        }
    }
}

/// How an opening ended.
#[derive(Debug)]
pub struct Outcome {
    /// The connector's result; `None` when it still waited for answers
    /// that never came.
    pub connector: Option<Result<Opened, OpeningError>>,
    /// Where the listener's session stands.
    pub session: Session,
    /// The listener closed the connection (a refusal or a broken stream).
    pub closed: bool,
}

/// Rounds of the conversation before it is given up (an honest opening
/// takes three).
const ROUNDS: usize = 8;

/// Plays `who`'s opening (asking for the MAP if `with_map`) against `exec`,
/// every frame on the wire passing through `wire` (frames beyond its end
/// are delivered).
///
/// # Panics
///
/// When either side writes bytes the other cannot frame or parse.
pub fn play(
    exec: &Executor,
    who: Who,
    with_map: bool,
    nonce: [u8; NONCE_LEN],
    wire: &mut dyn Iterator<Item = Tamper>,
) -> Outcome {
    let (role, name, key) = who.credentials();
    let mut to_listener = Vec::new();
    let mut opening = Opening::start(
        role,
        Capabilities::NONE,
        name,
        with_map,
        OpeningTags::CLIENT,
        Some(Credentials {
            key: Key::new(key),
            nonce,
        }),
        &mut to_listener,
    )
    .expect("the opening starts");
    let mut session = exec.new_session();
    let mut listener_reads = FrameDecoder::new();
    let mut connector_reads = FrameDecoder::new();
    let mut connector = None;
    let mut closed = false;
    for _ in 0..ROUNDS {
        let arriving = carry(&to_listener, wire);
        to_listener.clear();
        let mut to_connector = Vec::new();
        if !closed {
            closed = listen(
                exec,
                &mut session,
                &mut listener_reads,
                &arriving,
                &mut to_connector,
            );
        }
        let arriving = carry(&to_connector, wire);
        if connector.is_none() {
            connector = connect(
                &mut opening,
                &mut connector_reads,
                &arriving,
                &mut to_listener,
            );
        }
        if to_listener.is_empty() && (closed || connector.is_some()) {
            break;
        }
    }
    Outcome {
        connector,
        session,
        closed,
    }
}

/// The bytes that arrive when `sent` (whole frames) crosses the wire.
fn carry(sent: &[u8], wire: &mut dyn Iterator<Item = Tamper>) -> Vec<u8> {
    let mut arriving = Vec::new();
    for frame in sent_frames(sent) {
        wire.next()
            .unwrap_or(Tamper::Deliver)
            .apply(frame, &mut arriving);
    }
    arriving
}

/// The listener takes `arriving`; returns whether it closed the connection.
fn listen(
    exec: &Executor,
    session: &mut Session,
    reads: &mut FrameDecoder,
    mut arriving: &[u8],
    out: &mut Vec<u8>,
) -> bool {
    while !arriving.is_empty() {
        let Ok(used) = reads.feed(arriving) else {
            return true;
        };
        arriving = &arriving[used..];
        loop {
            let frame = match reads.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => return true,
            };
            match exec.handle_frame(session, frame, out) {
                Ok(Flow::Continue) => {}
                Ok(Flow::Close) | Err(_) => return true,
            }
        }
    }
    false
}

/// The connector takes `arriving`; returns its result once it has one.
fn connect(
    opening: &mut Opening,
    reads: &mut FrameDecoder,
    mut arriving: &[u8],
    out: &mut Vec<u8>,
) -> Option<Result<Opened, OpeningError>> {
    while !arriving.is_empty() {
        let used = match reads.feed(arriving) {
            Ok(used) => used,
            Err(e) => return Some(Err(OpeningError::Malformed(e))),
        };
        arriving = &arriving[used..];
        loop {
            let frame = match reads.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => return Some(Err(OpeningError::Malformed(e))),
            };
            match opening.handle_frame(frame, out) {
                Ok(Progress::Waiting) => {}
                Ok(Progress::Opened(opened)) => return Some(Ok(opened)),
                Err(e) => return Some(Err(e)),
            }
        }
    }
    None
}
