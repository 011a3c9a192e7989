//! The admin HTTP endpoint: `GET /metrics` and `GET /healthz` over a small,
//! defensive subset of HTTP/1.1, one short-lived thread per connection.
//!
//! Every request is answered with `Content-Length` and `Connection: close`. The
//! request head is capped at [`MAX_HEAD_BYTES`], a connection gets
//! [`REQUEST_TIMEOUT`] to send it, and at most [`MAX_CONNECTIONS`] are served at
//! once; more are answered 503 and closed. Untrusted bytes are only parsed, never
//! indexed blindly, so no input panics.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::lock;
use crate::registry::Registry;

/// The `Content-Type` of `/metrics`: the text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// The largest request head (request line and headers) accepted.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// How long a client has to send its request head, and to take the response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at the same time.
const MAX_CONNECTIONS: usize = 32;

/// How often the accept loop looks at the stop flag when nobody connects.
const ACCEPT_POLL: Duration = Duration::from_millis(10);

/// After answering, how long and how much a client's leftover input (say, a
/// request body) is read, so closing does not reset the connection under the
/// response.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);
const DRAIN_MAX_BYTES: usize = 64 * 1024;

/// What `/healthz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Serving: 200 with `ok`.
    Healthy,
    /// Not serving: 503 with this reason.
    Unhealthy(String),
}

/// The health check `/healthz` calls on every request.
pub type HealthCheck = Arc<dyn Fn() -> Health + Send + Sync>;

/// Why the admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound.
    #[error("cannot bind the admin endpoint to {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// The bound listener could not be set up.
    #[error("cannot set up the admin listener")]
    Listener(#[source] io::Error),
    /// The accept thread could not be started.
    #[error("cannot start the admin accept thread")]
    Spawn(#[source] io::Error),
}

/// A running admin endpoint. [`AdminServer::shutdown`], or dropping it, stops
/// accepting, closes the open connections and joins every thread.
#[derive(Debug)]
pub struct AdminServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Binds `addr` (port 0 picks a free port; see [`AdminServer::local_addr`])
    /// and serves `registry` on `/metrics` and `health` on `/healthz` from a
    /// thread of its own.
    pub fn start(
        addr: SocketAddr,
        registry: Arc<Registry>,
        health: HealthCheck,
    ) -> Result<Self, AdminError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| AdminError::Bind { addr, source })?;
        // Non-blocking, so the accept loop notices `stop` without a wake-up connection.
        listener
            .set_nonblocking(true)
            .map_err(AdminError::Listener)?;
        let local_addr = listener.local_addr().map_err(AdminError::Listener)?;
        let stop = Arc::new(AtomicBool::new(false));
        let routes = Arc::new(Routes { registry, health });
        let accept_thread = thread::Builder::new()
            .name("admin-accept".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || accept_loop(&listener, &routes, &stop)
            })
            .map_err(AdminError::Spawn)?;
        Ok(Self {
            local_addr,
            stop,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes open connections and joins every thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.accept_thread.take() {
            // The accept loop does not panic; if it did, there is nothing left to stop.
            let _ = thread.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// What the endpoint serves.
struct Routes {
    registry: Arc<Registry>,
    health: HealthCheck,
}

/// The connections being served, by id, so shutdown can close them and unblock
/// their threads.
type OpenConnections = Arc<Mutex<HashMap<u64, TcpStream>>>;

fn accept_loop(listener: &TcpListener, routes: &Arc<Routes>, stop: &AtomicBool) {
    let open = OpenConnections::default();
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0_u64;
    while !stop.load(Ordering::Acquire) {
        workers.retain(|worker| !worker.is_finished());
        match listener.accept() {
            Ok((stream, _peer)) => {
                if workers.len() >= MAX_CONNECTIONS {
                    refuse(stream);
                    continue;
                }
                next_id += 1;
                if let Some(worker) = spawn_worker(stream, next_id, routes, &open) {
                    workers.push(worker);
                }
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            // Nobody waiting (`WouldBlock`), or a transient failure such as running
            // out of file descriptors: wait a little either way instead of spinning.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
    for stream in lock(&open).values() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// Answers 503 when all connection slots are taken, without ever waiting: the
/// answer is a few bytes into a fresh socket's buffer, and only input that has
/// already arrived is read, so closing does not reset the connection under the
/// answer.
fn refuse(mut stream: TcpStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let response = Response::text(503, "too many admin connections\n");
    let _ = stream.write_all(&response.to_bytes(false));
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0_u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_MAX_BYTES {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Removes a connection from the open set when its thread ends, or when the
/// thread could not be started.
struct OpenGuard {
    open: OpenConnections,
    id: u64,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        lock(&self.open).remove(&self.id);
    }
}

fn spawn_worker(
    stream: TcpStream,
    id: u64,
    routes: &Arc<Routes>,
    open: &OpenConnections,
) -> Option<JoinHandle<()>> {
    let watch = stream.try_clone().ok()?;
    lock(open).insert(id, watch);
    let guard = OpenGuard {
        open: Arc::clone(open),
        id,
    };
    let routes = Arc::clone(routes);
    thread::Builder::new()
        .name("admin-conn".into())
        .spawn(move || {
            let _guard = guard;
            serve_connection(stream, &routes);
        })
        .ok()
}

fn serve_connection(mut stream: TcpStream, routes: &Routes) {
    // Some platforms hand out accepted sockets non-blocking like their listener.
    if stream.set_nonblocking(false).is_err()
        || stream.set_write_timeout(Some(REQUEST_TIMEOUT)).is_err()
    {
        return;
    }
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let (response, head_only) = match read_head(&mut stream, deadline) {
        Ok(head) => routes.respond(&head),
        Err(HeadError::Closed) | Err(HeadError::Io) => return,
        Err(HeadError::Truncated) => (Response::text(400, "bad request\n"), false),
        Err(HeadError::TooLarge) => (Response::text(431, "request head too large\n"), false),
        Err(HeadError::TimedOut) => (Response::text(408, "request timeout\n"), false),
    };
    if stream.write_all(&response.to_bytes(head_only)).is_ok() {
        let _ = stream.flush();
    }
    let _ = stream.shutdown(Shutdown::Write);
    drain(&mut stream);
}

/// Why no complete request head was read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// The client closed before sending anything.
    Closed,
    /// The client closed in the middle of the head.
    Truncated,
    /// The head is longer than [`MAX_HEAD_BYTES`].
    TooLarge,
    /// The client did not send a whole head in time.
    TimedOut,
    /// The connection failed.
    Io,
}

/// Reads until the blank line ending the head; returns the head without it.
fn read_head(stream: &mut impl TimedRead, deadline: Instant) -> Result<Vec<u8>, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    loop {
        if let Some(end) = head_end(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        let room = MAX_HEAD_BYTES.saturating_sub(buf.len());
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(HeadError::TimedOut);
        }
        stream.set_timeout(remaining).map_err(|_| HeadError::Io)?;
        let want = room.min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) if buf.is_empty() => return Err(HeadError::Closed),
            Ok(0) => return Err(HeadError::Truncated),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(error) => match error.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    return Err(HeadError::TimedOut);
                }
                _ => return Err(HeadError::Io),
            },
        }
    }
}

/// A reader whose reads can be bounded in time; a seam for testing [`read_head`].
trait TimedRead: Read {
    fn set_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl TimedRead for TcpStream {
    fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(timeout))
    }
}

/// Where the head ends: the index of the line feed that ends its last line, when
/// an empty line (`\n\n` or `\n\r\n`) follows it.
fn head_end(buf: &[u8]) -> Option<usize> {
    (0..buf.len())
        .find(|&i| buf[i] == b'\n' && matches!(&buf[i + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// Reads and discards what the client still sends, until it closes, for a short
/// while at most.
fn drain(stream: &mut TcpStream) {
    if stream.set_read_timeout(Some(DRAIN_TIMEOUT)).is_err() {
        return;
    }
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut sink = [0_u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_MAX_BYTES && Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// The parts of a request line the endpoint looks at.
#[derive(Debug, PartialEq, Eq)]
struct RequestLine<'a> {
    method: &'a str,
    path: &'a str,
}

/// Parses a request head: `METHOD SP origin-form-target SP HTTP/1.x`, then header
/// lines of the form `name: value`. `None` when anything is malformed.
fn parse_head(head: &[u8]) -> Option<RequestLine<'_>> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = std::str::from_utf8(lines.next()?).ok()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return None;
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return None;
    }
    for line in lines {
        let colon = line.iter().position(|&b| b == b':')?;
        if colon == 0 || !line[..colon].iter().copied().all(is_token_byte) {
            return None;
        }
    }
    let path = target.split_once('?').map_or(target, |(path, _query)| path);
    Some(RequestLine { method, path })
}

/// The characters of an HTTP token (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl Routes {
    /// The response to a request head, and whether it answers a HEAD request.
    fn respond(&self, head: &[u8]) -> (Response, bool) {
        let Some(request) = parse_head(head) else {
            return (Response::text(400, "bad request\n"), false);
        };
        let head_only = request.method == "HEAD";
        let readable = head_only || request.method == "GET";
        let response = match request.path {
            "/metrics" | "/healthz" if !readable => Response {
                allow: true,
                ..Response::text(405, "method not allowed\n")
            },
            "/metrics" => Response {
                status: 200,
                content_type: METRICS_CONTENT_TYPE,
                body: self.registry.render(),
                allow: false,
            },
            "/healthz" => match (self.health)() {
                Health::Healthy => Response::text(200, "ok\n"),
                Health::Unhealthy(reason) => Response::text(503, format!("unhealthy: {reason}\n")),
            },
            _ => Response::text(404, "not found\n"),
        };
        (response, head_only)
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
    /// Whether to send `Allow: GET, HEAD` (with 405).
    allow: bool,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: TEXT_CONTENT_TYPE,
            body: body.into(),
            allow: false,
        }
    }

    /// The bytes on the wire; a HEAD response keeps the headers of the GET one.
    fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let allow = if self.allow {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut bytes = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len(),
        )
        .into_bytes();
        if !head_only {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::net::Ipv4Addr;

    impl TimedRead for Cursor<Vec<u8>> {
        fn set_timeout(&mut self, _timeout: Duration) -> io::Result<()> {
            Ok(())
        }
    }

    fn head_of(bytes: &[u8]) -> Result<Vec<u8>, HeadError> {
        let deadline = Instant::now() + Duration::from_secs(1);
        read_head(&mut Cursor::new(bytes.to_vec()), deadline)
    }

    #[test]
    fn heads_end_at_an_empty_line() {
        assert_eq!(
            head_of(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody").unwrap(),
            b"GET / HTTP/1.1\r\nHost: x\r"
        );
        assert_eq!(head_of(b"GET / HTTP/1.0\n\n").unwrap(), b"GET / HTTP/1.0");
        assert_eq!(head_of(b""), Err(HeadError::Closed));
        assert_eq!(head_of(b"GET / HTTP/1.1\r\n"), Err(HeadError::Truncated));
        assert_eq!(
            head_of(&vec![b'a'; MAX_HEAD_BYTES + 10]),
            Err(HeadError::TooLarge)
        );
        // A head that exactly fills the cap is still accepted.
        let mut full = b"GET / HTTP/1.1\r\nX: ".to_vec();
        full.resize(MAX_HEAD_BYTES - 4, b'a');
        full.extend_from_slice(b"\r\n\r\n");
        assert!(head_of(&full).is_ok());
    }

    #[test]
    fn request_lines() {
        fn parsed(head: &[u8]) -> Option<(&str, &str)> {
            parse_head(head).map(|request| (request.method, request.path))
        }
        assert_eq!(
            parsed(b"GET /metrics HTTP/1.1\r\nHost: a:1\r\nAccept: */*\r"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            parsed(b"HEAD /healthz?verbose=1 HTTP/1.0"),
            Some(("HEAD", "/healthz"))
        );
        for bad in [
            &b""[..],
            b"\r",
            b"garbage",
            b"GET /metrics",
            b"GET  /metrics HTTP/1.1",
            b"GET /metrics HTTP/1.1 extra",
            b"GET metrics HTTP/1.1",
            b"GET /met\x01rics HTTP/1.1",
            b"GET /metrics HTTP/2.0",
            b"G(T /metrics HTTP/1.1",
            b"GET /\xff HTTP/1.1",
            b"GET /metrics HTTP/1.1\r\nno colon\r",
            b"GET /metrics HTTP/1.1\r\n: empty name\r",
            b"GET /metrics HTTP/1.1\r\nbad name: x\r",
        ] {
            assert_eq!(parsed(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn never_panics_on_arbitrary_heads() {
        // A cheap deterministic fuzz: every prefix and many byte mutations of a
        // valid request.
        let valid = b"GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\nA: b\r\n\r\n";
        let routes = Routes {
            registry: Arc::new(Registry::new()),
            health: Arc::new(|| Health::Healthy),
        };
        for len in 0..=valid.len() {
            let _ = routes.respond(&valid[..len]);
            let _ = head_end(&valid[..len]);
        }
        for i in 0..valid.len() {
            for byte in [0_u8, b'\n', b'\r', b' ', b':', b'?', 0x80, 0xff] {
                let mut mutated = valid.to_vec();
                mutated[i] = byte;
                let _ = routes.respond(&mutated);
                let _ = head_end(&mutated);
                let _ = head_of(&mutated);
            }
        }
    }

    #[test]
    fn responses_on_the_wire() {
        let bytes = Response::text(200, "ok\n").to_bytes(false);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 3\r\nConnection: close\r\n\r\nok\n"
        );
        let head = Response {
            allow: true,
            ..Response::text(405, "method not allowed\n")
        }
        .to_bytes(true);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 19\r\nAllow: GET, HEAD\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn connections_beyond_the_cap_get_503() {
        let server = AdminServer::start(
            (Ipv4Addr::LOCALHOST, 0).into(),
            Arc::new(Registry::new()),
            Arc::new(|| Health::Healthy),
        )
        .unwrap();
        // Idle clients take every slot: they are accepted in the order they connected.
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(server.local_addr()).unwrap())
            .collect();
        let (status, body) =
            crate::http_get(server.local_addr(), "/metrics", Duration::from_secs(2)).unwrap();
        assert_eq!(
            (status, body.as_str()),
            (503, "too many admin connections\n")
        );
        drop(idle);
        // Once the idle clients are gone, their slots come back.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (status, _) =
                crate::http_get(server.local_addr(), "/healthz", Duration::from_secs(2)).unwrap();
            if status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "slots were not released");
            thread::sleep(Duration::from_millis(20));
        }
        server.shutdown();
    }
}
