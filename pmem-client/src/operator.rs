//! What an operator asks of the servers themselves: rotating a region's
//! key, and scrubbing the regions' blocks against their checksums.
//!
//! A region key is made by the server that owns the region and handed out
//! in its MAP only to those allowed to use the region. Rotating it draws a
//! fresh random key on that server (kept durably with the region); the old
//! key opens nothing from then on. Fabric devices learn the new key the
//! first time the server refuses the old one, and clients learn it from
//! their device when their next request is refused.
//!
//! A checksum scrub asks each region's server to check every block of the
//! region against the checksum it recorded for it (recording it the first
//! time, or when the block was written since); a block that changed
//! without a write is reported by index.
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
use proto::{FrameDecoder, Message, Status, block_sums, scrub};
use topology::secrets::{Principal, SecretError, read_key};
use topology::{Layout, LayoutEntry, LayoutError, RegionId, ServerId, Topology};

/// Why an operator's action on a server did not happen.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
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
    /// The server authenticates its peers and no operator key was given.
    #[error(
        "server {server} requires authentication: pass --secrets DIR (or set \
         PMEM_FABRIC_SECRETS) holding operator.{operator}.key (`testbed keygen TOPOLOGY \
         --secrets DIR` makes keys; `testbed up` prints where its keys are)"
    )]
    AuthRequired {
        /// The server.
        server: String,
        /// The operator's name.
        operator: String,
    },
    /// An operator key was given but the server does not authenticate
    /// (it runs `--insecure`), so it cannot prove itself.
    #[error(
        "server {server} does not use authentication (it runs --insecure): drop --secrets \
         (and PMEM_FABRIC_SECRETS) to act on it; with a key, pmemctl does not trust a server \
         that cannot prove it holds one"
    )]
    NoAuth {
        /// The server.
        server: String,
    },
    /// The server did not answer in time.
    #[error("server {server} at {addr} did not answer within {timeout:?}")]
    NoAnswer {
        /// The server.
        server: String,
        /// Its NIC's address.
        addr: String,
        /// How long was waited.
        timeout: Duration,
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
    /// The server answered the order with an error.
    #[error("server {server} refused to {action} {region}: {status}{hint}")]
    Refused {
        /// The server.
        server: String,
        /// What was asked: "rotate the key of", "scrub".
        action: &'static str,
        /// The region.
        region: String,
        /// Its answer.
        status: Status,
        /// What to do about it, if anything helps.
        hint: &'static str,
    },
    /// The server holds no copy of the region.
    #[error("server {server} holds no copy of region {region} in the topology")]
    NoCopy {
        /// The region.
        region: String,
        /// The server named.
        server: String,
    },
    /// The server sent something that is not an answer to the order.
    #[error("server {server} answered the {action} order with {what}")]
    Protocol {
        /// The server.
        server: String,
        /// What was asked: "rotation", "scrub".
        action: &'static str,
        /// What came back.
        what: String,
    },
}

/// The hint for a refusal with `status`.
fn refusal_hint(status: Status) -> &'static str {
    match status {
        Status::AccessDenied => " (only operators may: give --operator and --secrets)",
        _ => "",
    }
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
) -> Result<(), OperatorError> {
    let layout = Layout::new(topology)?;
    let entry = layout
        .entry_by_id(region)
        .ok_or_else(|| OperatorError::UnknownRegion(region.to_string()))?;
    let mut session = OperatorSession::open(topology, entry, operator, secrets, timeout)?;
    const ROTATE_TAG: u64 = 3;
    let frame = session.ask(&Message::RotateKey(entry.region), ROTATE_TAG, "rotation")?;
    let server = session.server;
    match proto::parse_frame(&frame) {
        Ok((Message::Response(r), ROTATE_TAG)) if r.status == Status::Ok => Ok(()),
        Ok((Message::Response(r), ROTATE_TAG)) => Err(OperatorError::Refused {
            server,
            action: "rotate the key of",
            region: region.to_string(),
            status: r.status,
            hint: refusal_hint(r.status),
        }),
        Ok((other, tag)) => Err(OperatorError::Protocol {
            server,
            action: "rotation",
            what: format!("{} with tag {tag}", other.opcode()),
        }),
        Err(e) => Err(OperatorError::Protocol {
            server,
            action: "rotation",
            what: format!("a frame that does not parse: {e}"),
        }),
    }
}

/// What a checksum scrub found in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionScrub {
    /// The region.
    pub region: RegionId,
    /// The server holding it.
    pub server: String,
    /// Bytes per block.
    pub block_len: u64,
    /// Blocks in the region.
    pub blocks: u64,
    /// Blocks that matched their checksum.
    pub verified: u64,
    /// Blocks whose checksum was recorded now (first scrub since the
    /// server started, or written since the last scrub).
    pub recorded: u64,
    /// Blocks not checked: the region is written over RDMA, which the
    /// server does not see.
    pub unwatched: u64,
    /// The blocks that no longer match their checksum, by index.
    pub mismatches: Vec<u64>,
}

/// Asks the servers holding `regions` (every region of the topology when
/// empty) to check each block against the checksum they recorded, as
/// operator `operator` (see [`rotate_key`] for `secrets`). The first scrub
/// after a server starts records the checksums; later ones verify them.
pub fn scrub_checksums(
    topology: &Topology,
    regions: &[RegionId],
    operator: &str,
    secrets: Option<&Path>,
    timeout: Duration,
) -> Result<Vec<RegionScrub>, OperatorError> {
    let layout = Layout::new(topology)?;
    let entries: Vec<&LayoutEntry> = if regions.is_empty() {
        layout.entries().iter().collect()
    } else {
        regions
            .iter()
            .map(|id| {
                layout
                    .entry_by_id(id)
                    .ok_or_else(|| OperatorError::UnknownRegion(id.to_string()))
            })
            .collect::<Result<_, _>>()?
    };
    // One connection per server, whichever of its regions it scrubs.
    let mut sessions: Vec<OperatorSession> = Vec::new();
    let mut found = Vec::with_capacity(entries.len());
    for entry in entries {
        let server = entry.server.as_str();
        let at = match sessions.iter().position(|s| s.server == server) {
            Some(at) => at,
            None => {
                sessions.push(OperatorSession::open(
                    topology, entry, operator, secrets, timeout,
                )?);
                sessions.len() - 1
            }
        };
        found.push(sessions[at].scrub_region(entry)?);
    }
    Ok(found)
}

/// The checksums of every block of one copy of a region, as its bytes
/// were when its server read them (BLOCK_SUMS: computed on request,
/// nothing recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySums {
    /// The region.
    pub region: RegionId,
    /// The server holding the copy.
    pub server: String,
    /// Bytes per block.
    pub block_len: u64,
    /// One checksum per block, in block order.
    pub sums: Vec<u64>,
}

/// The layout entry of `region`'s copy on `server`: the region's entry with
/// the copy's server and socket (the primary's own for the primary).
fn copy_entry(
    topology: &Topology,
    layout: &Layout,
    region: &RegionId,
    server: &ServerId,
) -> Result<LayoutEntry, OperatorError> {
    let mut entry = layout
        .entry_by_id(region)
        .ok_or_else(|| OperatorError::UnknownRegion(region.to_string()))?
        .clone();
    let sets = topology.replica_sets();
    let copy = sets
        .iter()
        .find(|s| &s.region == region)
        .and_then(|s| s.on(server))
        .ok_or_else(|| OperatorError::NoCopy {
            region: region.to_string(),
            server: server.to_string(),
        })?;
    entry.server = copy.server.clone();
    entry.server_index = copy.server_index;
    entry.socket = copy.socket.clone();
    entry.socket_index = copy.socket_index;
    entry.device = copy.device.clone();
    Ok(entry)
}

/// Asks the server of `region`'s copy on `server` for the checksum of
/// every block of that copy as it is now, as operator `operator` (see
/// [`rotate_key`] for `secrets`).
pub fn copy_sums(
    topology: &Topology,
    region: &RegionId,
    server: &ServerId,
    operator: &str,
    secrets: Option<&Path>,
    timeout: Duration,
) -> Result<CopySums, OperatorError> {
    let layout = Layout::new(topology)?;
    let entry = copy_entry(topology, &layout, region, server)?;
    OperatorSession::open(topology, &entry, operator, secrets, timeout)?.sum_region(&entry)
}

/// Asks the server of `region`'s copy on `server` to check the copy's
/// blocks against the checksums it recorded (see [`scrub_checksums`]).
pub fn scrub_copy(
    topology: &Topology,
    region: &RegionId,
    server: &ServerId,
    operator: &str,
    secrets: Option<&Path>,
    timeout: Duration,
) -> Result<RegionScrub, OperatorError> {
    let layout = Layout::new(topology)?;
    let entry = copy_entry(topology, &layout, region, server)?;
    OperatorSession::open(topology, &entry, operator, secrets, timeout)?.scrub_region(&entry)
}

/// A connection to a region's server, opened as an operator.
struct OperatorSession {
    admin: AdminSession,
    server: String,
    /// The operator's name.
    operator: String,
    /// How long an answer may take.
    timeout: Duration,
    /// The NIC address it was reached on.
    addr: String,
    /// The tag of the last order sent.
    tag: u64,
}

impl OperatorSession {
    /// Connects to the server owning `entry` (on the NIC of its socket,
    /// else any) and opens the connection as operator `operator`.
    fn open(
        topology: &Topology,
        entry: &LayoutEntry,
        operator: &str,
        secrets: Option<&Path>,
        timeout: Duration,
    ) -> Result<Self, OperatorError> {
        let server = entry.server.to_string();
        let nics = topology
            .servers
            .iter()
            .find(|s| s.id == entry.server)
            .map(|s| s.nics.as_slice())
            .unwrap_or_default();
        let nic = nics
            .iter()
            .find(|n| n.socket == entry.socket)
            .or_else(|| nics.first())
            .ok_or_else(|| OperatorError::NoNic(server.clone()))?;
        let credentials = match secrets {
            Some(dir) => Some(crate::conn::credentials(proto::auth::Key::new(read_key(
                dir,
                Principal::Operator(operator),
            )?))),
            None => None,
        };
        let io_error = |source| OperatorError::Io {
            server: server.clone(),
            addr: nic.listen.clone(),
            source,
        };
        let mut admin = AdminSession::connect(&nic.listen, timeout).map_err(io_error)?;
        let mut out = Vec::new();
        let opening_error = |source| OperatorError::Opening {
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
        let has_key = secrets.is_some();
        loop {
            admin.stream.write_all(&out).map_err(io_error)?;
            out.clear();
            let frame = match admin.next_frame() {
                Ok(frame) => frame,
                // HELLO came but no challenge: the server does not authenticate.
                Err(e) if timed_out(&e) && has_key && opening.peer().is_some() => {
                    return Err(OperatorError::NoAuth { server });
                }
                Err(e) if timed_out(&e) => {
                    return Err(OperatorError::NoAnswer {
                        server,
                        addr: nic.listen.clone(),
                        timeout,
                    });
                }
                Err(e) => return Err(io_error(e)),
            };
            match opening.handle_frame(&frame, &mut out) {
                Ok(Progress::Waiting) => {}
                Ok(Progress::Opened(_)) => break,
                Err(OpeningError::NoChallenge) if has_key => {
                    return Err(OperatorError::NoAuth { server });
                }
                Err(e) => return Err(opening_error(e)),
            }
        }
        Ok(Self {
            admin,
            server,
            operator: operator.to_owned(),
            addr: nic.listen.clone(),
            tag: OpeningTags::CLIENT.map,
            timeout,
        })
    }

    /// Sends `message` with `tag` and returns the frame that answers it.
    fn ask(
        &mut self,
        message: &Message<'_>,
        tag: u64,
        action: &'static str,
    ) -> Result<Vec<u8>, OperatorError> {
        let request = message
            .encode_to_vec(tag)
            .map_err(|e| OperatorError::Protocol {
                server: self.server.clone(),
                action,
                what: e.to_string(),
            })?;
        let io_error = |source| OperatorError::Io {
            server: self.server.clone(),
            addr: self.addr.clone(),
            source,
        };
        let admin = &mut self.admin;
        admin.stream.write_all(&request).map_err(io_error)?;
        let frame = match admin.next_frame() {
            Ok(frame) => frame,
            Err(e) if timed_out(&e) => {
                return Err(OperatorError::NoAnswer {
                    server: self.server.clone(),
                    addr: self.addr.clone(),
                    timeout: self.timeout,
                });
            }
            Err(e) => return Err(io_error(e)),
        };
        // A server that authenticates challenges right after its HELLO; an
        // operator without a key took that HELLO for the whole opening.
        if let Ok((Message::AuthChallenge(_), _)) = proto::parse_frame(&frame) {
            return Err(OperatorError::AuthRequired {
                server: self.server.clone(),
                operator: self.operator.clone(),
            });
        }
        Ok(frame)
    }

    /// `frame` read as the answer to order `tag` about `entry`: the report
    /// `pick` takes from it, or the server's refusal to `refuse` the region,
    /// or a protocol error naming the `action` order.
    fn report_for<'f, T>(
        &self,
        frame: &'f [u8],
        tag: u64,
        entry: &LayoutEntry,
        refuse: &'static str,
        action: &'static str,
        pick: impl FnOnce(Message<'f>) -> Result<T, Message<'f>>,
    ) -> Result<T, OperatorError> {
        let protocol = |what: String| OperatorError::Protocol {
            server: self.server.clone(),
            action,
            what,
        };
        let (message, t) = proto::parse_frame(frame)
            .map_err(|e| protocol(format!("a frame that does not parse: {e}")))?;
        if t != tag {
            return Err(protocol(format!("{} with tag {t}", message.opcode())));
        }
        match pick(message) {
            Ok(report) => Ok(report),
            Err(Message::Response(r)) => Err(OperatorError::Refused {
                server: self.server.clone(),
                action: refuse,
                region: entry.region_id.to_string(),
                status: r.status,
                hint: refusal_hint(r.status),
            }),
            Err(other) => Err(protocol(format!("{} with tag {t}", other.opcode()))),
        }
    }

    /// The checksum of every block of `entry`'s copy, a run at a time.
    fn sum_region(&mut self, entry: &LayoutEntry) -> Result<CopySums, OperatorError> {
        let mut found = CopySums {
            region: entry.region_id.clone(),
            server: self.server.clone(),
            block_len: 0,
            sums: Vec::new(),
        };
        // The first run is one block: its report gives the region's count.
        let (mut first, mut blocks) = (0u64, 1u32);
        loop {
            self.tag += 1;
            let tag = self.tag;
            let ask = block_sums::Repr {
                region: entry.region.0,
                first,
                blocks,
            };
            let frame = self.ask(&Message::BlockSums(ask), tag, "block sums")?;
            let report = self.report_for(
                &frame,
                tag,
                entry,
                "sum the blocks of",
                "block sums",
                |m| match m {
                    Message::BlockSumsReport(r) => Ok(r),
                    other => Err(other),
                },
            )?;
            if report.head.first != first || report.sums.is_empty() {
                return Err(OperatorError::Protocol {
                    server: self.server.clone(),
                    action: "block sums",
                    what: format!(
                        "{} sums from block {} for a run from block {first}",
                        report.sums.len(),
                        report.head.first
                    ),
                });
            }
            found.block_len = report.head.block_len.into();
            first += report.sums.len() as u64;
            found.sums.extend(report.sums);
            if first >= report.head.total {
                return Ok(found);
            }
            blocks = u32::try_from(report.head.total - first)
                .unwrap_or(u32::MAX)
                .min(block_sums::MAX_BLOCKS);
        }
    }

    /// Scrubs every block of `entry`'s region, a run of blocks at a time.
    fn scrub_region(&mut self, entry: &LayoutEntry) -> Result<RegionScrub, OperatorError> {
        let mut found = RegionScrub {
            region: entry.region_id.clone(),
            server: self.server.clone(),
            block_len: 0,
            blocks: 0,
            verified: 0,
            recorded: 0,
            unwatched: 0,
            mismatches: Vec::new(),
        };
        // The first run is one block: its report gives the region's count.
        let (mut first, mut blocks) = (0u64, 1u32);
        loop {
            self.tag += 1;
            let tag = self.tag;
            let ask = scrub::Repr {
                region: entry.region.0,
                first,
                blocks,
            };
            let frame = self.ask(&Message::Scrub(ask), tag, "scrub")?;
            let report = self.report_for(&frame, tag, entry, "scrub", "scrub", |m| match m {
                Message::ScrubReport(r) => Ok(r),
                other => Err(other),
            })?;
            found.block_len = report.head.block_len.into();
            found.blocks = report.head.total;
            found.verified += u64::from(report.verified);
            found.recorded += u64::from(report.recorded);
            found.unwatched += u64::from(report.unwatched);
            found.mismatches.extend(report.mismatches);
            first += u64::from(blocks);
            if first >= report.head.total {
                return Ok(found);
            }
            blocks = u32::try_from(report.head.total - first)
                .unwrap_or(u32::MAX)
                .min(scrub::MAX_BLOCKS);
        }
    }
}

/// Whether a read failed because its timeout passed.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
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
