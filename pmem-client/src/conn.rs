//! One path's connection to its fabric device: handshake, then a writer task
//! that batches frames into few writes and a reader task that hands each
//! response to the request waiting for its tag.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use proto::hello::{Capabilities, Role};
use proto::opening::{Opening, OpeningError, OpeningTags, Progress};
use proto::{FrameDecoder, Message, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// The protocol version this client speaks.
pub use proto::PROTOCOL_VERSION;
/// Most bytes the writer gathers into one write.
const WRITE_BATCH: usize = 256 * 1024;

/// A response as the application side needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Its status.
    pub status: Status,
    /// Old value of an atomic.
    pub value: u64,
    /// READ data.
    pub data: Vec<u8>,
}

/// Why a path could not be connected.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is not `ip:port`.
    #[error("bad address {0:?}")]
    BadAddress(String),
    /// The socket could not be set up, bound or connected.
    #[error("cannot connect to {addr}")]
    Io {
        /// Where.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The device did not answer the handshake in time.
    #[error("{addr}: no answer to HELLO/MAP within {0:?}", .timeout)]
    HandshakeTimeout {
        /// Where.
        addr: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The device refused the client.
    #[error("{addr}: the fabric device refused client {client:?}: {status}")]
    Refused {
        /// Where.
        addr: String,
        /// Who we said we were.
        client: String,
        /// What it answered.
        status: Status,
    },
    /// The device's address map is not ours.
    #[error(
        "{addr}: fabric device {device:?} serves layout {theirs} but this client's topology gives {ours}; \
         both must load the same topology"
    )]
    DigestMismatch {
        /// Where.
        addr: String,
        /// The device's name.
        device: String,
        /// Our digest (hex).
        ours: String,
        /// Theirs (hex).
        theirs: String,
    },
    /// The RDMA side of a RoCE path could not be set up (no RDMA library or
    /// device, no GID for the address, the queue pair refused, …).
    #[error("{addr}: RoCE queue pair set-up")]
    Rdma {
        /// The device port's control address.
        addr: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The topology gives an RNIC the `roce` transport but this build has
    /// no verbs support.
    #[error(
        "{addr}: RNIC {rnic} uses transport \"roce\", but pmem-client was built without \
         the `verbs` feature"
    )]
    NoVerbs {
        /// The device port's control address.
        addr: String,
        /// The RNIC.
        rnic: String,
    },
    /// The RNIC's `local_addr` is not an IPv4 address (RoCE needs one).
    #[error("{addr}: RNIC {rnic}: transport \"roce\" needs an IPv4 local_addr, got {local:?}")]
    RoceAddress {
        /// The device port's control address.
        addr: String,
        /// The RNIC.
        rnic: String,
        /// What the topology gives.
        local: Option<String>,
    },
    /// The device authenticates its clients and this one has no key.
    #[error(
        "{addr}: fabric device {device:?} requires authentication: pass --secrets DIR (or set \
         PMEM_FABRIC_SECRETS) holding client {client}'s key (`testbed keygen TOPOLOGY --secrets \
         DIR` makes keys; `testbed up` prints where its keys are)"
    )]
    AuthRequired {
        /// Where.
        addr: String,
        /// The device's name from its HELLO.
        device: String,
        /// Who we said we were.
        client: String,
    },
    /// This client has a key but the device does not authenticate (it runs
    /// `--insecure`), so it cannot prove itself and is not trusted.
    #[error(
        "{addr}: fabric device {device:?} does not use authentication (it runs --insecure): \
         drop --secrets (and PMEM_FABRIC_SECRETS), or start the fabric with keys; a client \
         with a key does not use a device that cannot prove it holds one"
    )]
    NoAuth {
        /// Where.
        addr: String,
        /// The device's name from its HELLO.
        device: String,
    },
    /// The device runs a newer epoch of the cluster map than the client
    /// said: the client brings its map up to that epoch and opens again.
    #[error(
        "{addr}: fabric device {device:?} runs map epoch {theirs}, newer than this client's \
         {ours}"
    )]
    NewerMap {
        /// Where.
        addr: String,
        /// The device's name.
        device: String,
        /// The client's epoch.
        ours: u64,
        /// The device's.
        theirs: u64,
    },
    /// The device runs an older epoch of the cluster map than the client:
    /// it is behind its own watch of the map and catches up shortly.
    #[error(
        "{addr}: fabric device {device:?} still runs map epoch {theirs}, older than this \
         client's {ours}; it catches up through its own watch of the map"
    )]
    Behind {
        /// Where.
        addr: String,
        /// The device's name.
        device: String,
        /// The client's epoch.
        ours: u64,
        /// The device's.
        theirs: u64,
    },
    /// The device broke the protocol during the handshake.
    #[error("{addr}: unexpected handshake answer: {what}")]
    Protocol {
        /// Where.
        addr: String,
        /// What arrived.
        what: String,
    },
}

/// `key` with a fresh random nonce, for one opening.
pub(crate) fn credentials(key: proto::auth::Key) -> proto::opening::Credentials {
    let mut nonce = [0u8; proto::auth::NONCE_LEN];
    // Linux's source does not fail once booted; zeros would only make this
    // one proof's nonce predictable, not reveal the key.
    let _ = getrandom::fill(&mut nonce);
    proto::opening::Credentials { key, nonce }
}

/// What a client announces in its HELLO.
pub(crate) const CLIENT_CAPABILITIES: Capabilities =
    Capabilities::PIPELINING.union(Capabilities::EXACTLY_ONCE);

fn protocol_error(addr: &str, what: String) -> ConnectError {
    ConnectError::Protocol {
        addr: addr.to_owned(),
        what,
    }
}

/// The [`ConnectError`] for a failed opening with the device at `addr`.
#[cfg(feature = "verbs")]
pub(crate) fn opening_error(addr: &str, client: &str, e: OpeningError) -> ConnectError {
    opening_error_with(addr, client, None, e)
}

/// The [`ConnectError`] for a failed opening with the device `peer` at
/// `addr` (its name, once its HELLO arrived), telling an authentication
/// mismatch from other failures: a challenge to a client without a key, or
/// a device that does not challenge one with a key.
pub(crate) fn opening_error_with(
    addr: &str,
    client: &str,
    peer: Option<&str>,
    e: OpeningError,
) -> ConnectError {
    let device = || peer.unwrap_or(addr).to_owned();
    match e {
        OpeningError::Refused(status) => ConnectError::Refused {
            addr: addr.to_owned(),
            client: client.to_owned(),
            status,
        },
        OpeningError::ChallengeWithoutKey => ConnectError::AuthRequired {
            addr: addr.to_owned(),
            device: device(),
            client: client.to_owned(),
        },
        OpeningError::NoChallenge => ConnectError::NoAuth {
            addr: addr.to_owned(),
            device: device(),
        },
        other => protocol_error(addr, other.to_string()),
    }
}

/// Checks the device's MAP against the layout digest this client loaded.
pub(crate) fn check_digest(
    addr: &str,
    device: &str,
    map: Option<&proto::map::Repr>,
    digest: [u8; 32],
) -> Result<(), ConnectError> {
    match map {
        Some(map) if map.digest == digest => Ok(()),
        Some(map) => Err(ConnectError::DigestMismatch {
            addr: addr.to_owned(),
            device: device.to_owned(),
            ours: hex(&digest),
            theirs: hex(&map.digest),
        }),
        None => Err(protocol_error(addr, "no MAP in the opening".to_owned())),
    }
}

/// Who waits for the answer of a tag.
#[derive(Debug)]
enum Waiter {
    /// A request (or MAP_EPOCH): its response.
    Response(oneshot::Sender<Response>),
    /// A MAP_REQUEST: the MAP.
    Map(oneshot::Sender<proto::map::Repr>),
}

type Pending = Arc<Mutex<HashMap<u64, Waiter>>>;

/// Why saying the epoch in the opening failed.
enum Said {
    Io(std::io::Error),
    Protocol(String),
}

/// The end of an opening that says an epoch: MAP_EPOCH, then MAP_REQUEST
/// (so the MAP is the one the device runs once it has heard the epoch);
/// the device's answer to each.
async fn say_epoch_and_ask_map(
    stream: &mut TcpStream,
    decoder: &mut FrameDecoder,
    epoch: u64,
) -> Result<(EpochAnswer, proto::map::Repr), Said> {
    let mut out = Vec::new();
    let encode = |e: proto::Error| Said::Protocol(e.to_string());
    Message::MapEpoch(epoch)
        .encode_into(EPOCH_TAG, &mut out)
        .map_err(encode)?;
    Message::MapRequest
        .encode_into(OpeningTags::CLIENT.map, &mut out)
        .map_err(encode)?;
    stream.write_all(&out).await.map_err(Said::Io)?;
    let (mut answer, mut map) = (None, None);
    while answer.is_none() || map.is_none() {
        let frame = read_frame(stream, decoder).await.map_err(Said::Io)?;
        match proto::parse_frame(&frame) {
            Ok((Message::Response(r), EPOCH_TAG)) => {
                answer = Some(EpochAnswer::of(&Response {
                    status: r.status,
                    value: r.value,
                    data: Vec::new(),
                }));
            }
            Ok((Message::Map(m), tag)) if tag == OpeningTags::CLIENT.map => map = Some(m),
            Ok((Message::Response(r), tag)) if tag == OpeningTags::CLIENT.map => {
                return Err(Said::Protocol(format!("MAP_REQUEST refused: {}", r.status)));
            }
            Ok((other, tag)) => {
                return Err(Said::Protocol(format!(
                    "unexpected {} with tag {tag} after MAP_EPOCH",
                    other.opcode()
                )));
            }
            Err(e) => return Err(Said::Protocol(format!("malformed frame: {e}"))),
        }
    }
    match (answer, map) {
        (Some(answer), Some(map)) => Ok((answer, map)),
        _ => Err(Said::Protocol("no answer to MAP_EPOCH".to_owned())),
    }
}

/// What a device answered to the map epoch a client said (MAP_EPOCH).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochAnswer {
    /// The client follows no map and said none.
    NotSaid,
    /// The device does not fence connections by epoch (it answered
    /// MAP_EPOCH with an error, or with epoch 0: it reads a topology file
    /// and follows no map): the connection is unfenced, and the MAP's
    /// digest says whether both run the same map.
    Unfenced,
    /// The device runs this epoch, not newer than the client's.
    Runs(u64),
    /// The device runs this epoch, newer than the client's.
    Newer(u64),
}

impl EpochAnswer {
    /// The answer carried by the ACKNOWLEDGE of a MAP_EPOCH.
    pub fn of(response: &Response) -> Self {
        match response.status {
            Status::Ok if response.value == 0 => EpochAnswer::Unfenced,
            Status::Ok => EpochAnswer::Runs(response.value),
            Status::StaleMap => EpochAnswer::Newer(response.value),
            _ => EpochAnswer::Unfenced,
        }
    }
}

/// Tag of the MAP_EPOCH sent in the opening (HELLO and MAP_REQUEST use
/// [`OpeningTags::CLIENT`]; requests start at 1 once the opening is over).
const EPOCH_TAG: u64 = 3;

/// Checks what a device answered at the opening against the client's
/// `epoch` (with its `digest`): a newer device is [`ConnectError::NewerMap`],
/// an older one [`ConnectError::Behind`]; an unfenced device, or one on the
/// same epoch, must serve the same layout.
pub(crate) fn check_epoch(
    addr: &str,
    device: &str,
    answer: EpochAnswer,
    epoch: u64,
    map: Option<&proto::map::Repr>,
    digest: [u8; 32],
) -> Result<(), ConnectError> {
    match answer {
        EpochAnswer::Newer(theirs) => Err(ConnectError::NewerMap {
            addr: addr.to_owned(),
            device: device.to_owned(),
            ours: epoch,
            theirs,
        }),
        EpochAnswer::Runs(theirs) if theirs < epoch => Err(ConnectError::Behind {
            addr: addr.to_owned(),
            device: device.to_owned(),
            ours: epoch,
            theirs,
        }),
        EpochAnswer::Runs(_) | EpochAnswer::Unfenced | EpochAnswer::NotSaid => {
            check_digest(addr, device, map, digest)
        }
    }
}

/// A live connection of one path.
#[derive(Debug)]
pub struct PathConn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next_tag: AtomicU64,
    alive: Arc<AtomicBool>,
    /// The device's name from its HELLO.
    pub device: String,
}

/// The connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads one complete frame from `stream` into `decoder`'s keeping.
async fn read_frame(
    stream: &mut TcpStream,
    decoder: &mut FrameDecoder,
) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; 4096];
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => return Ok(frame.to_vec()),
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut data = &buf[..n];
        while !data.is_empty() {
            let taken = decoder
                .feed(data)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            data = &data[taken..];
        }
    }
}

/// What a client brings to an opening besides its name and key: the
/// layout digest it loaded and, when it follows the cluster map, the
/// map's epoch it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapView {
    /// The digest of the client's layout.
    pub digest: [u8; 32],
    /// The epoch said with MAP_EPOCH; `None`: the client reads a file and
    /// says none.
    pub epoch: Option<u64>,
}

/// Connects a path: binds the RNIC's local address when there is one, sends
/// HELLO as `client` (and its proof with a key), says the map epoch of
/// `view` when it has one (MAP_EPOCH), fetches MAP and checks it against
/// `view` (`check_epoch`); returns the connection and the device's MAP
/// (with the keys of the regions the client may use). `on_lost` runs once
/// when the connection dies after the handshake.
pub async fn connect(
    device_addr: &str,
    local_addr: Option<&str>,
    client: &str,
    key: Option<proto::auth::Key>,
    view: MapView,
    timeout: Duration,
    on_lost: Box<dyn FnOnce() + Send>,
) -> Result<(PathConn, proto::map::Repr), ConnectError> {
    let addr: SocketAddr = device_addr
        .parse()
        .map_err(|_| ConnectError::BadAddress(device_addr.to_owned()))?;
    let io_err = |source| ConnectError::Io {
        addr: device_addr.to_owned(),
        source,
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(io_err)?;
    if let Some(local) = local_addr {
        let local: SocketAddr = local
            .parse()
            .or_else(|_| local.parse().map(|ip| SocketAddr::new(ip, 0)))
            .map_err(|_| ConnectError::BadAddress(local.to_owned()))?;
        socket.bind(local).map_err(io_err)?;
    }
    // The device's name once its HELLO arrived while this client, having a
    // key, waits for its challenge: a device that never sends one does not
    // authenticate.
    let mut awaiting_challenge: Option<String> = None;
    let has_key = key.is_some();
    let handshake = async {
        let mut stream = socket.connect(addr).await.map_err(io_err)?;
        stream.set_nodelay(true).map_err(io_err)?;
        let mut out = Vec::new();
        let mut opening = Opening::start(
            Role::Client,
            CLIENT_CAPABILITIES,
            client,
            view.epoch.is_none(),
            OpeningTags::CLIENT,
            key.map(credentials),
            &mut out,
        )
        .map_err(|e| protocol_error(device_addr, e.to_string()))?;
        stream.write_all(&out).await.map_err(io_err)?;
        let mut decoder = FrameDecoder::new();
        loop {
            let frame = read_frame(&mut stream, &mut decoder)
                .await
                .map_err(io_err)?;
            out.clear();
            let peer = opening.peer().map(|(name, _)| name.to_owned());
            let progress = opening.handle_frame(&frame, &mut out);
            stream.write_all(&out).await.map_err(io_err)?;
            awaiting_challenge = match (&progress, proto::parse_frame(&frame)) {
                (Ok(Progress::Waiting), Ok((Message::Hello(_), _))) if has_key => {
                    opening.peer().map(|(name, _)| name.to_owned())
                }
                _ => None,
            };
            match progress {
                Ok(Progress::Waiting) => {}
                Ok(Progress::Opened(opened)) => {
                    let device = opened.peer;
                    let (answer, map) = match view.epoch {
                        None => (EpochAnswer::NotSaid, opened.map),
                        Some(epoch) => {
                            let said = say_epoch_and_ask_map(&mut stream, &mut decoder, epoch)
                                .await
                                .map_err(|e| match e {
                                    Said::Io(source) => io_err(source),
                                    Said::Protocol(what) => protocol_error(device_addr, what),
                                })?;
                            (said.0, Some(said.1))
                        }
                    };
                    check_epoch(
                        device_addr,
                        &device,
                        answer,
                        view.epoch.unwrap_or(0),
                        map.as_ref(),
                        view.digest,
                    )?;
                    return Ok((stream, decoder, device, map.unwrap_or_default()));
                }
                Err(e) => {
                    return Err(opening_error_with(device_addr, client, peer.as_deref(), e));
                }
            }
        }
    };
    let outcome = tokio::time::timeout(timeout, handshake).await;
    let (stream, decoder, device, map) = match outcome {
        Ok(result) => result?,
        Err(_) => {
            return Err(match awaiting_challenge {
                Some(device) => ConnectError::NoAuth {
                    addr: device_addr.to_owned(),
                    device,
                },
                None => ConnectError::HandshakeTimeout {
                    addr: device_addr.to_owned(),
                    timeout,
                },
            });
        }
    };

    let (reader, writer) = stream.into_split();
    let (frames, queue) = mpsc::unbounded_channel();
    let pending: Pending = Arc::default();
    let alive = Arc::new(AtomicBool::new(true));
    let lost = Arc::new(Mutex::new(Some(on_lost)));
    let die = {
        let (pending, alive, lost) = (Arc::clone(&pending), Arc::clone(&alive), Arc::clone(&lost));
        move || {
            alive.store(false, Ordering::SeqCst);
            // Dropping the senders wakes every waiter with "connection lost".
            pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            let callback = lost.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(callback) = callback {
                callback();
            }
        }
    };
    tokio::spawn(write_loop(writer, queue, die.clone()));
    tokio::spawn(read_loop(reader, decoder, Arc::clone(&pending), die));
    Ok((
        PathConn {
            frames,
            pending,
            next_tag: AtomicU64::new(1),
            alive,
            device,
        },
        map,
    ))
}

async fn write_loop(
    mut writer: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    die: impl FnOnce(),
) {
    let mut batch = Vec::with_capacity(64 * 1024);
    while let Some(first) = queue.recv().await {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < WRITE_BATCH {
            match queue.try_recv() {
                Ok(frame) => batch.extend_from_slice(&frame),
                Err(_) => break,
            }
        }
        if writer.write_all(&batch).await.is_err() {
            break;
        }
    }
    die();
}

/// Hands a response (or MAP) frame to whoever waits for its tag.
fn deliver(frame: &[u8], pending: &Pending) {
    let Ok((message, tag)) = proto::parse_frame(frame) else {
        // Malformed: nothing can wait for it.
        return;
    };
    let waiter = pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&tag);
    match (message, waiter) {
        (Message::Response(r), Some(Waiter::Response(waiter))) => {
            let _ = waiter.send(Response {
                status: r.status,
                value: r.value,
                data: r.payload.to_vec(),
            });
        }
        (Message::Map(map), Some(Waiter::Map(waiter))) => {
            let _ = waiter.send(map);
        }
        // Anything else (a refused MAP_REQUEST included): the waiter, if
        // any, is dropped and sees the answer as missing.
        _ => {}
    }
}

async fn read_loop(
    mut reader: OwnedReadHalf,
    mut decoder: FrameDecoder,
    pending: Pending,
    die: impl FnOnce(),
) {
    let mut buf = vec![0u8; 256 * 1024];
    'outer: loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut data = &buf[..n];
        while !data.is_empty() {
            match decoder.feed(data) {
                Ok(taken) => data = &data[taken..],
                Err(_) => break 'outer,
            }
            // Drain after every feed: it makes room when a large frame
            // filled the decoder.
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => deliver(frame, &pending),
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
        }
    }
    die();
}

impl PathConn {
    /// Whether the connection still works.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Sends `message` with a fresh tag; the receiver gets its response, or
    /// an error when the connection dies first.
    pub fn send(&self, message: &Message<'_>) -> Result<(u64, oneshot::Receiver<Response>), Lost> {
        if !self.is_alive() {
            return Err(Lost);
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let bytes = message.encode_to_vec(tag).map_err(|_| Lost)?;
        let (tx, rx) = oneshot::channel();
        self.queue(tag, bytes, Waiter::Response(tx))?;
        Ok((tag, rx))
    }

    /// Queues `bytes` (a frame with `tag`) with `waiter` for its answer.
    fn queue(&self, tag: u64, bytes: Vec<u8>, waiter: Waiter) -> Result<(), Lost> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(tag, waiter);
        if self.frames.send(bytes).is_err() || !self.is_alive() {
            self.forget(tag);
            return Err(Lost);
        }
        Ok(())
    }

    /// Says on this connection that the client runs map epoch `epoch`
    /// from now on (MAP_EPOCH); the device's answer, `None` when the
    /// connection died or nothing came within `timeout`.
    pub async fn say_epoch(&self, epoch: u64, timeout: Duration) -> Option<EpochAnswer> {
        let (tag, reply) = self.send(&Message::MapEpoch(epoch)).ok()?;
        match tokio::time::timeout(timeout, reply).await {
            Ok(Ok(response)) => Some(EpochAnswer::of(&response)),
            _ => {
                self.forget(tag);
                None
            }
        }
    }

    /// Asks the device for its MAP on this connection; `None` when the
    /// connection died, the device refused or nothing came within
    /// `timeout`.
    pub async fn request_map(&self, timeout: Duration) -> Option<proto::map::Repr> {
        if !self.is_alive() {
            return None;
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let bytes = Message::MapRequest.encode_to_vec(tag).ok()?;
        let (tx, rx) = oneshot::channel();
        self.queue(tag, bytes, Waiter::Map(tx)).ok()?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(map)) => Some(map),
            _ => {
                self.forget(tag);
                None
            }
        }
    }

    /// Stops waiting for `tag` (after a timeout).
    pub fn forget(&self, tag: u64) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&tag);
    }
}

impl Drop for PathConn {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(status: Status, value: u64) -> Response {
        Response {
            status,
            value,
            data: Vec::new(),
        }
    }

    #[test]
    fn a_map_epoch_answer_says_the_devices_epoch_or_that_it_does_not_fence() {
        assert_eq!(EpochAnswer::of(&ack(Status::Ok, 4)), EpochAnswer::Runs(4));
        // A device on a topology file acknowledges with epoch 0.
        assert_eq!(EpochAnswer::of(&ack(Status::Ok, 0)), EpochAnswer::Unfenced);
        assert_eq!(
            EpochAnswer::of(&ack(Status::StaleMap, 9)),
            EpochAnswer::Newer(9)
        );
        assert_eq!(
            EpochAnswer::of(&ack(Status::Unsupported, 0)),
            EpochAnswer::Unfenced
        );
    }

    fn map_with(digest: [u8; 32]) -> proto::map::Repr {
        proto::map::Repr {
            digest,
            extent_size: 1 << 20,
            entries: Vec::new(),
        }
    }

    #[test]
    fn the_opening_checks_the_epoch_then_the_digest() {
        let ours = [1; 32];
        let same = map_with(ours);
        let other = map_with([2; 32]);
        let check = |answer, map: &proto::map::Repr| {
            check_epoch("127.0.0.1:1", "F", answer, 5, Some(map), ours)
        };
        assert!(check(EpochAnswer::Runs(5), &same).is_ok());
        assert!(matches!(
            check(EpochAnswer::Newer(6), &same),
            Err(ConnectError::NewerMap { theirs: 6, .. })
        ));
        let behind = check(EpochAnswer::Runs(4), &same).unwrap_err();
        assert!(
            matches!(
                behind,
                ConnectError::Behind {
                    theirs: 4,
                    ours: 5,
                    ..
                }
            ),
            "{behind}"
        );
        assert!(behind.to_string().contains("catches up"), "{behind}");
        // A device that does not fence is checked by its layout, as a
        // file client checks it.
        assert!(check(EpochAnswer::Unfenced, &same).is_ok());
        assert!(matches!(
            check(EpochAnswer::Unfenced, &other),
            Err(ConnectError::DigestMismatch { .. })
        ));
        assert!(matches!(
            check(EpochAnswer::Runs(5), &other),
            Err(ConnectError::DigestMismatch { .. })
        ));
    }
}
