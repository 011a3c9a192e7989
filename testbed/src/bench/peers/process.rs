//! Starting, watching and reaping the peers' processes: free ports,
//! ready checks, captured output, timeouts.

use std::io;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::output::tail;
use super::procfs::listens_on;
use super::{CLIENT_OUTPUT_CAP, PeerError, SERVER_OUTPUT_CAP};

/// A loopback TCP port that was free a moment ago, below the ephemeral
/// range, never the same twice in one process (testkit's search).
pub(super) fn free_loopback_port() -> Result<u16, PeerError> {
    testkit::try_free_loopback_port()
        .ok_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no free loopback port").into())
}

/// Starts `program` with `args(port)` on free ports until it listens on its
/// port (three tries: another process may take the port first).
pub(super) fn start_server(
    program: &str,
    timeout: Duration,
    args: &dyn Fn(u16) -> Vec<String>,
) -> Result<(Process, u16), PeerError> {
    let mut last = None;
    for _ in 0..3 {
        let port = free_loopback_port()?;
        let mut process = Process::spawn(program, &args(port), SERVER_OUTPUT_CAP)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = process.exited() {
                last = Some(process.not_ready(port, format!("it exited ({status})")));
                break;
            }
            if listens_on(process.pid(), port) {
                return Ok((process, port));
            }
            if Instant::now() >= deadline {
                return Err(process.not_ready(port, format!("not listening after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Err(last.unwrap_or_else(|| PeerError::InvalidArgument(format!("{program} never started"))))
}

// ---------------------------------------------------------------------------
// Processes.

/// The last bytes a child wrote to one of its pipes, filled by a thread.
#[derive(Clone, Default)]
pub(super) struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Captured({len} bytes)")
    }
}

impl Captured {
    /// Captures `pipe` (when there is one), its reader thread going into
    /// `readers`.
    pub(super) fn of(
        pipe: Option<impl Read + Send + 'static>,
        cap: usize,
        readers: &mut Vec<JoinHandle<()>>,
    ) -> Self {
        match pipe {
            Some(pipe) => {
                let (captured, thread) = Self::start(pipe, cap);
                readers.push(thread);
                captured
            }
            None => Self::default(),
        }
    }

    /// Reads `from` to its end on a thread, keeping the last `cap` bytes.
    pub(super) fn start(
        mut from: impl Read + Send + 'static,
        cap: usize,
    ) -> (Self, JoinHandle<()>) {
        let captured = Self::default();
        let sink = captured.clone();
        let thread = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match from.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut buf = sink.0.lock().unwrap_or_else(PoisonError::into_inner);
                        buf.extend_from_slice(&chunk[..n]);
                        if buf.len() > cap {
                            let excess = buf.len() - cap;
                            buf.drain(..excess);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        (captured, thread)
    }

    pub(super) fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// A child process whose output is captured; killed and reaped on drop
/// unless it was waited for.
#[derive(Debug)]
pub(super) struct Process {
    child: Child,
    command: String,
    stdout: Captured,
    stderr: Captured,
    readers: Vec<JoinHandle<()>>,
    reaped: bool,
}

/// How a child ended and what it wrote.
#[derive(Debug)]
pub(super) struct Finished {
    pub(super) status: ExitStatus,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Finished {
    pub(super) fn all_output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl Process {
    pub(super) fn spawn(program: &str, args: &[String], cap: usize) -> Result<Self, PeerError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| PeerError::Spawn {
                program: program.to_owned(),
                source,
            })?;
        let mut readers = Vec::new();
        let stdout = Captured::of(child.stdout.take(), cap, &mut readers);
        let stderr = Captured::of(child.stderr.take(), cap, &mut readers);
        Ok(Self {
            child,
            command: command_line(program, args),
            stdout,
            stderr,
            readers,
            reaped: false,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, when it has exited.
    pub(super) fn exited(&mut self) -> Option<ExitStatus> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.reaped = true;
                Some(status)
            }
            _ => None,
        }
    }

    /// The end of everything it wrote.
    pub(super) fn output_tail(&self) -> String {
        tail(&format!("{}\n{}", self.stdout.text(), self.stderr.text()))
    }

    pub(super) fn not_ready(&self, port: u16, why: String) -> PeerError {
        // Give the reader threads a moment to take the last words of a
        // process that just exited.
        std::thread::sleep(Duration::from_millis(20));
        PeerError::NotReady {
            command: self.command.clone(),
            port,
            why,
            output_tail: self.output_tail(),
        }
    }

    /// Waits for it to exit; kills it after `timeout`.
    pub(super) fn finish(mut self, timeout: Duration) -> Result<Finished, PeerError> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                self.reaped = true;
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.reaped = true;
                self.join_readers();
                return Err(PeerError::Timeout {
                    command: self.command.clone(),
                    after: timeout,
                    output_tail: self.output_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        self.join_readers();
        Ok(Finished {
            status,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
        })
    }

    pub(super) fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `program` to its end within `timeout`; a failure exit is an error.
pub(super) fn run(
    program: &str,
    args: &[String],
    timeout: Duration,
) -> Result<Finished, PeerError> {
    let done = Process::spawn(program, args, CLIENT_OUTPUT_CAP)?.finish(timeout)?;
    if !done.status.success() {
        let said = if done.stderr.trim().is_empty() {
            &done.stdout
        } else {
            &done.stderr
        };
        return Err(PeerError::Failed {
            command: command_line(program, args),
            status: done.status.to_string(),
            stderr_tail: tail(said),
        });
    }
    Ok(done)
}

// ---------------------------------------------------------------------------
// Small helpers.

/// `duration` in whole seconds (rounded), at least one: the tools take
/// integers.
pub(super) fn whole_seconds(duration: Duration) -> u64 {
    (duration.as_secs_f64().round() as u64).max(1)
}

pub(super) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A command line for messages; empty arguments shown as `""`.
pub(super) fn command_line(program: &str, args: &[String]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        if arg.is_empty() {
            line.push_str("\"\"");
        } else {
            line.push_str(arg);
        }
    }
    line
}
