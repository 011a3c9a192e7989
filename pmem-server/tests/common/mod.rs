//! Helpers for tests that run the real `pmem-server` binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use proto::request::{self, Target};
use proto::{FrameDecoder, Message, Opcode, Status};
use topology::{EnvOverrides, Layout, RegionIndex, RegionOffset, Topology};

/// How long a server may take to report ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A single-server topology with the given regions (id, size), listening on
/// ephemeral loopback ports.
pub fn write_topology(dir: &Path, regions: &[(&str, &str)]) -> PathBuf {
    let mut text = String::from(
        "[pool]\nname = \"test\"\nextent_size = \"1MiB\"\n\n[[servers]]\nid = \"S\"\n\
         [[servers.sockets]]\nid = \"0\"\n[[servers.sockets.devices]]\nid = \"pmem0\"\n",
    );
    for (id, size) in regions {
        text.push_str(&format!(
            "[[servers.sockets.devices.regions]]\nid = \"{id}\"\nsize = \"{size}\"\n"
        ));
    }
    text.push_str(
        "[[servers.nics]]\nid = \"n0\"\nsocket = \"0\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[fabric_devices]]\nid = \"F\"\nports = [{ id = \"p0\", listen = \"127.0.0.1:0\" }]\n\
         links = [{ server = \"S\", nic = \"n0\" }]\n\n\
         [[clients]]\nid = \"c\"\nrnics = [{ id = \"r0\", fabric_device = \"F\" }]\n",
    );
    let path = dir.join("topology.toml");
    std::fs::write(&path, text).expect("write topology");
    path
}

/// The layout a topology file gives.
pub fn layout(path: &Path) -> Layout {
    let t = Topology::load_with(path, &EnvOverrides::None).expect("load topology");
    Layout::new(&t).expect("layout")
}

/// A running `pmem-server` process.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// The data address of NIC n0.
    pub data: SocketAddr,
    /// The admin address.
    pub admin: SocketAddr,
    /// The persistence mode it reported.
    pub mode: String,
    stderr: mpsc::Receiver<String>,
}

/// The persistence mechanism the test run asks for (`--persistence`), from
/// `PMEM_SERVER_TEST_PERSISTENCE`; the server's default when unset.
fn persistence_override(extra: &[&str]) -> Vec<String> {
    match std::env::var("PMEM_SERVER_TEST_PERSISTENCE") {
        Ok(mode) if !extra.contains(&"--persistence") => vec!["--persistence".into(), mode],
        _ => Vec::new(),
    }
}

/// Starts the server on `config` with `data_dir`, plus `extra` flags, and
/// waits for its ready line. On failure, returns everything it printed.
pub fn start(config: &Path, data_dir: &Path, extra: &[&str]) -> Result<ServerProcess, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmem-server"))
        .arg("--config")
        .arg(config)
        .args(["--server", "S", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .args(persistence_override(extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pmem-server");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("ready ") {
                let _ = ready_tx.send(line);
            }
        }
    });
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        let _ = err_tx.send(text);
    });
    match ready_rx.recv_timeout(READY_TIMEOUT) {
        Ok(line) => {
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|t| t.strip_prefix(key))
                    .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                    .to_owned()
            };
            Ok(ServerProcess {
                data: field("nic.n0=").parse().expect("data address"),
                admin: field("admin=").parse().expect("admin address"),
                mode: field("mode="),
                child,
                stderr: err_rx,
            })
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(err_rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_default())
        }
    }
}

impl ServerProcess {
    /// Sends a signal to the process.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// `kill -9`: no chance to flush anything.
    pub fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit; returns the status and stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let status = self.child.wait().expect("wait");
        let stderr = self
            .stderr
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_default();
        (status, stderr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub opcode: Opcode,
    pub tag: u64,
    pub status: Status,
    pub value: u64,
    pub data: Vec<u8>,
}

/// A raw protocol connection to a server.
#[derive(Debug)]
pub struct Conn {
    pub stream: TcpStream,
    decoder: FrameDecoder,
    next_tag: u64,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Self {
            stream,
            decoder: FrameDecoder::new(),
            next_tag: 1,
        }
    }

    /// Sends a message with a fresh tag and returns the tag.
    pub fn send(&mut self, message: &Message<'_>) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        let bytes = message.encode_to_vec(tag).expect("encode");
        self.stream.write_all(&bytes).expect("send");
        tag
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send raw");
    }

    /// Receives the next reply; `None` when the server closed the connection.
    pub fn try_recv(&mut self) -> Option<Reply> {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("server framing") {
                let (message, tag) = proto::parse_frame(frame).expect("server reply parses");
                let opcode = message.opcode();
                return Some(match message {
                    Message::Response(r) => Reply {
                        opcode,
                        tag,
                        status: r.status,
                        value: r.value,
                        data: r.payload.to_vec(),
                    },
                    other => Reply {
                        opcode: other.opcode(),
                        tag,
                        status: Status::Ok,
                        value: match other {
                            Message::Pong(v) => v,
                            _ => 0,
                        },
                        data: Vec::new(),
                    },
                });
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("recv: {e}"),
            };
            let mut data = &buf[..n];
            while !data.is_empty() {
                let taken = self.decoder.feed(data).expect("server framing");
                data = &data[taken..];
            }
        }
    }

    pub fn recv(&mut self) -> Reply {
        self.try_recv().expect("server closed the connection")
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, req: request::Repr<'_>) -> Reply {
        let tag = self.send(&Message::Request(req));
        let reply = self.recv();
        assert_eq!(reply.tag, tag, "reply to another request");
        reply
    }
}

/// The region-addressed target of `offset` in region `index`.
pub fn at(index: u32, offset: u64) -> Target {
    Target::Region(RegionOffset::new(RegionIndex(index), offset))
}

/// The key of region `index`.
pub fn key(layout: &Layout, index: u32) -> u64 {
    layout.entry(RegionIndex(index)).expect("region").key
}

/// Reads `len` bytes at `offset` of a region file's data, straight from disk.
pub fn file_bytes(data_dir: &Path, region: &str, offset: u64, len: usize) -> Vec<u8> {
    let bytes = std::fs::read(data_dir.join(format!("{region}.pmem"))).expect("region file");
    let start = 4096 + offset as usize;
    bytes[start..start + len].to_vec()
}
