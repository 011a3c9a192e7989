//! What an operator asks of the servers themselves: rotating a region's key.
//!
//! A region key is made by the server that owns the region and handed out
//! in its MAP only to those allowed to use the region. Rotating it draws a
//! fresh random key on that server (kept durably with the region); the old
//! key opens nothing from then on. Fabric devices learn the new key the
//! first time the server refuses the old one, and clients learn it from
//! their device when their next request is refused.
//!
//! The operator talks to the owning server directly, as `Role::Admin`
//! under its name, proving `operator.<name>.key` when the server
//! authenticates its peers.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use proto::decoder::{ReadError, ReadOutcome};
use proto::hello::{Capabilities, Role};
use proto::opening::{Opening, OpeningError, OpeningTags, Progress};
use proto::{FrameDecoder, Message, Status};
use topology::secrets::{Principal, SecretError, read_key};
use topology::{Layout, LayoutError, RegionId, Topology};

/// Why a key rotation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The topology's layout cannot be built.
    #[error("the topology's layout")]
    Layout(#[from] LayoutError),
    /// The topology has no such region.
    #[error("no region {0:?} in the topology")]
    UnknownRegion(String),
    /// The owning server has no NIC to reach it on.
    #[error("server {0:?} has no NIC in the topology")]
    NoNic(String),
    /// The operator's key file cannot be used.
    #[error("the operator's key")]
    Secret(#[from] SecretError),
    /// The server cannot be reached or the connection broke.
    #[error("server {server} at {addr}")]
    Io {
        /// The server.
        server: String,
        /// Its NIC's address.
        addr: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The server did not let the operator in.
    #[error("server {server} refused the operator {operator:?}")]
    Opening {
        /// The server.
        server: String,
        /// The operator's name.
        operator: String,
        /// How the opening failed.
        #[source]
        source: OpeningError,
    },
    /// The server answered the rotation with an error.
    #[error("server {server} refused to rotate the key of {region}: {status}{hint}")]
    Refused {
        /// The server.
        server: String,
        /// The region.
        region: String,
        /// Its answer.
        status: Status,
        /// What to do about it, if anything helps.
        hint: &'static str,
    },
    /// The server sent something that is not an answer to the rotation.
    #[error("server {server} answered the rotation with {what}")]
    Protocol {
        /// The server.
        server: String,
        /// What came back.
        what: String,
    },
}

/// Asks the server owning `region` to replace its key with a fresh random
/// one, as operator `operator`. With `secrets`, proves
/// `operator.<operator>.key` from that folder (a server started with
/// `--secrets` rotates keys for its operators only); without, the server
/// must be one that does not authenticate its peers.
pub fn rotate_key(
    topology: &Topology,
    region: &RegionId,
    operator: &str,
    secrets: Option<&Path>,
    timeout: Duration,
) -> Result<(), RotateError> {
    let layout = Layout::new(topology)?;
    let entry = layout
        .entry_by_id(region)
        .ok_or_else(|| RotateError::UnknownRegion(region.to_string()))?;
    let server = entry.server.to_string();
    let nics = topology
        .servers
        .iter()
        .find(|s| s.id == entry.server)
        .map(|s| s.nics.as_slice())
        .unwrap_or_default();
    // The NIC on the region's socket, else any.
    let nic = nics
        .iter()
        .find(|n| n.socket == entry.socket)
        .or_else(|| nics.first())
        .ok_or_else(|| RotateError::NoNic(server.clone()))?;
    let credentials = match secrets {
        Some(dir) => Some(crate::conn::credentials(proto::auth::Key::new(read_key(
            dir,
            Principal::Operator(operator),
        )?))),
        None => None,
    };
    let io_error = |source| RotateError::Io {
        server: server.clone(),
        addr: nic.listen.clone(),
        source,
    };
    let mut session = AdminSession::connect(&nic.listen, timeout).map_err(io_error)?;
    let mut out = Vec::new();
    let opening_error = |source| RotateError::Opening {
        server: server.clone(),
        operator: operator.to_owned(),
        source,
    };
    let mut opening = Opening::start(
        Role::Admin,
        Capabilities::NONE,
        operator,
        false,
        OpeningTags::CLIENT,
        credentials,
        &mut out,
    )
    .map_err(|e| opening_error(OpeningError::Malformed(e)))?;
    loop {
        session.stream.write_all(&out).map_err(io_error)?;
        out.clear();
        let frame = session.next_frame().map_err(io_error)?;
        match opening.handle_frame(&frame, &mut out) {
            Ok(Progress::Waiting) => {}
            Ok(Progress::Opened(_)) => break,
            Err(e) => return Err(opening_error(e)),
        }
    }
    const ROTATE_TAG: u64 = 3;
    let request = Message::RotateKey(entry.region)
        .encode_to_vec(ROTATE_TAG)
        .map_err(|e| RotateError::Protocol {
            server: server.clone(),
            what: e.to_string(),
        })?;
    session.stream.write_all(&request).map_err(io_error)?;
    let frame = session.next_frame().map_err(io_error)?;
    match proto::parse_frame(&frame) {
        Ok((Message::Response(r), ROTATE_TAG)) if r.status == Status::Ok => Ok(()),
        Ok((Message::Response(r), ROTATE_TAG)) => Err(RotateError::Refused {
            server,
            region: region.to_string(),
            status: r.status,
            hint: match r.status {
                Status::AccessDenied => {
                    " (only operators rotate keys: give --operator and --secrets)"
                }
                _ => "",
            },
        }),
        Ok((other, tag)) => Err(RotateError::Protocol {
            server,
            what: format!("{} with tag {tag}", other.opcode()),
        }),
        Err(e) => Err(RotateError::Protocol {
            server,
            what: format!("a frame that does not parse: {e}"),
        }),
    }
}

/// A blocking connection to a server, read frame by frame.
struct AdminSession {
    stream: TcpStream,
    decoder: FrameDecoder,
}

impl AdminSession {
    fn connect(addr: &str, timeout: Duration) -> std::io::Result<Self> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(timeout))?;
                    stream.set_write_timeout(Some(timeout))?;
                    return Ok(Self {
                        stream,
                        decoder: FrameDecoder::new(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrNotAvailable.into()))
    }

    /// The next whole frame the server sends.
    fn next_frame(&mut self) -> std::io::Result<Vec<u8>> {
        let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        loop {
            if let Some(frame) = self.decoder.next_frame().map_err(invalid)? {
                return Ok(frame.to_vec());
            }
            match self.decoder.read_from(&mut self.stream, 1 << 20) {
                Ok(ReadOutcome::Data(_) | ReadOutcome::Full) => {}
                Ok(ReadOutcome::Eof) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Err(ReadError::Io(e)) => return Err(e),
                Err(ReadError::Framing(e)) => return Err(invalid(e)),
            }
        }
    }
}
