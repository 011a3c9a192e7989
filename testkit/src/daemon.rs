//! A daemon under test: spawned, waited for until it prints its ready line,
//! signalled, and killed and reaped when dropped.
//!
//! Every pmem-fabric daemon announces readiness with one stdout line
//! `ready key=value key=value …` naming what it bound, e.g.
//! `ready server=A mode=msync admin=127.0.0.1:1234 nic.n0=127.0.0.1:5678`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a daemon may take to print its ready line, by default.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`Daemon::terminate`] waits for the exit after SIGTERM.
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Daemon::wait_for_log`] waits for a line (a bound on a wait,
/// not a measurement).
pub const LOG_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to wait for the stderr pipe to close once the process is gone.
const STDERR_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`Daemon::freeze`] waits for every thread to stop.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(20);

/// What to run: the program, its arguments and extra environment.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to the inherited environment.
    pub env: Vec<(String, String)>,
    /// How long to wait for the ready line.
    pub ready_timeout: Duration,
}

impl DaemonSpec {
    /// `program` without arguments, waiting [`READY_TIMEOUT`] for readiness.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: READY_TIMEOUT,
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I>(mut self, args: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the daemon.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Waits `timeout` for the ready line instead of [`READY_TIMEOUT`].
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }
}

/// The `key=value` fields of a ready line `ready key=value …`, or what is
/// wrong with the line.
pub fn parse_ready_line(line: &str) -> Result<BTreeMap<String, String>, String> {
    let Some(rest) = line.strip_prefix("ready ") else {
        return Err(format!("not a ready line: {line:?}"));
    };
    let mut fields = BTreeMap::new();
    for token in rest.split_whitespace() {
        let Some((key, value)) = token.split_once('=') else {
            return Err(format!("{token:?} is not key=value in {line:?}"));
        };
        if key.is_empty() {
            return Err(format!("{token:?} has no key in {line:?}"));
        }
        if fields.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("{key:?} appears twice in {line:?}"));
        }
    }
    Ok(fields)
}

/// Everything a daemon writes to stderr, collected by a background thread
/// so that the pipe never fills.
#[derive(Debug)]
struct StderrLog {
    text: Arc<Mutex<Vec<u8>>>,
    /// Disconnects when the pipe has closed and everything is in `text`
    /// (in a mutex so that a `Daemon` can be shared between threads).
    closed: Mutex<mpsc::Receiver<()>>,
}

impl StderrLog {
    fn collect(mut pipe: ChildStderr) -> Self {
        let text = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, closed) = mpsc::channel::<()>();
        let sink = Arc::clone(&text);
        std::thread::spawn(move || {
            let _closed_tx = closed_tx;
            let mut buf = [0u8; 4096];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        Self {
            text,
            closed: Mutex::new(closed),
        }
    }

    /// What has arrived so far.
    fn so_far(&self) -> String {
        let text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Everything, once the pipe has closed (or after a short wait, in case a
    /// grandchild keeps it open).
    fn all(&self) -> String {
        // Only ever disconnects; a timeout means the pipe is still open.
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = closed.recv_timeout(STDERR_DRAIN_TIMEOUT);
        self.so_far()
    }
}

/// Reads stdout line by line: sends the first ready line, then keeps
/// draining so that the daemon never blocks on a full pipe. The sender drops
/// when stdout closes.
fn watch_stdout(stdout: ChildStdout, ready: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        let mut ready = Some(ready);
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            if text.starts_with("ready ")
                && let Some(ready) = ready.take()
            {
                let _ = ready.send(text.to_owned());
            }
        }
    });
}

/// Kills and reaps a child, returning how it ended if that is known.
fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    let _ = child.kill();
    child.wait().ok()
}

/// A spawned daemon that has printed its ready line.
///
/// Dropping it kills (SIGKILL) and reaps the process.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    program: String,
    ready_line: String,
    /// The `key=value` fields of the ready line.
    pub fields: BTreeMap<String, String>,
    stderr: StderrLog,
}

impl Daemon {
    /// Starts `spec.program` with stdout and stderr piped and waits for its
    /// first stdout line starting with `ready `.
    ///
    /// When the process exits first, or stays silent past
    /// `spec.ready_timeout`, it is killed and the error is everything it
    /// printed on stderr (with a note when that says nothing, or on timeout).
    pub fn spawn(spec: DaemonSpec) -> Result<Daemon, String> {
        let program = spec.program.display().to_string();
        let mut child = Command::new(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = StderrLog::collect(child.stderr.take().expect("stderr is piped"));
        let (ready_tx, ready_rx) = mpsc::channel();
        watch_stdout(stdout, ready_tx);
        let failure = match ready_rx.recv_timeout(spec.ready_timeout) {
            Ok(line) => match parse_ready_line(&line) {
                Ok(fields) => {
                    return Ok(Daemon {
                        child,
                        program,
                        ready_line: line,
                        fields,
                        stderr,
                    });
                }
                Err(why) => {
                    kill_and_reap(&mut child);
                    format!("{program}: bad ready line: {why}")
                }
            },
            Err(RecvTimeoutError::Timeout) => {
                kill_and_reap(&mut child);
                format!(
                    "{program}: no ready line within {:?}; killed",
                    spec.ready_timeout
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                // Stdout closed without a ready line: the process is exiting.
                let status = kill_and_reap(&mut child);
                let text = stderr.all();
                if !text.trim().is_empty() {
                    return Err(text);
                }
                let status = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
                return Err(format!(
                    "{program} ended ({status}) before its ready line, printing nothing on stderr"
                ));
            }
        };
        let mut text = stderr.all();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&failure);
        Err(text)
    }

    /// The whole ready line.
    pub fn ready_line(&self) -> &str {
        &self.ready_line
    }

    /// The value of field `key` of the ready line.
    ///
    /// # Panics
    ///
    /// When the ready line has no such field.
    pub fn field(&self, key: &str) -> &str {
        self.fields.get(key).map_or_else(
            || {
                panic!(
                    "{}: no {key:?} in the ready line {:?}",
                    self.program, self.ready_line
                )
            },
            String::as_str,
        )
    }

    /// Field `key` of the ready line as a socket address, e.g. `addr("admin")`
    /// or `addr("nic.n0")`.
    ///
    /// # Panics
    ///
    /// When the field is missing or not an address.
    pub fn addr(&self, key: &str) -> SocketAddr {
        let value = self.field(key);
        value.parse().unwrap_or_else(|e| {
            panic!(
                "{}: {key}={value} is not an address ({e}) in {:?}",
                self.program, self.ready_line
            )
        })
    }

    /// For a fabric device: waits until at least `count` of its links to
    /// server NICs are up (their `fabric_device_link_up` gauges read 1), so
    /// that requests right after start do not meet a link still handshaking.
    ///
    /// # Panics
    ///
    /// When they are not up within 20 s; the message holds the metrics.
    pub fn wait_links_up(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = telemetry::http_get(self.addr("admin"), "/metrics", Duration::from_secs(5))
                .map(|(_, body)| body)
                .unwrap_or_default();
            let up = text
                .lines()
                .filter(|l| l.starts_with("fabric_device_link_up{") && l.ends_with(" 1"))
                .count();
            if up >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {up} of {count} links up after 20 s:\n{text}",
                self.ready_line
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process (SIGSTOP) and returns once every one of its
    /// threads is stopped: `kill(2)` only marks the signal pending, and a
    /// thread running on another CPU may read, send or answer a request
    /// before it stops.
    ///
    /// # Panics
    ///
    /// When the signal cannot be sent, or the threads are not all stopped
    /// within 20 s.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let deadline = std::time::Instant::now() + FREEZE_TIMEOUT;
        loop {
            let states: Vec<char> = std::fs::read_dir(&tasks)
                .map(|dir| {
                    dir.filter_map(|task| {
                        let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
                        // The state follows the command name, which is in
                        // parentheses and may hold spaces.
                        stat.rsplit_once(") ")?.1.chars().next()
                    })
                    .collect()
                })
                .unwrap_or_default();
            if !states.is_empty() && states.iter().all(|&s| s == 'T' || s == 't') {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not stop: thread states {states:?}",
                self.program
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`) to the process.
    ///
    /// # Panics
    ///
    /// When `kill(2)` fails, e.g. because the process was already reaped.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits in pid_t");
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            panic!(
                "kill({pid}, {signal}) on {}: {}",
                self.program,
                std::io::Error::last_os_error()
            );
        }
    }

    /// `kill -9`: the daemon gets no chance to flush or say goodbye.
    pub fn kill9(mut self) {
        kill_and_reap(&mut self.child);
    }

    /// Sends SIGTERM and waits for the exit; returns the exit status and
    /// everything the daemon printed on stderr.
    ///
    /// # Panics
    ///
    /// When the daemon is still running [`TERMINATE_TIMEOUT`] after the
    /// signal (it is then killed), with its stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        match self.wait_exit(TERMINATE_TIMEOUT) {
            Some(status) => (status, self.stderr.all()),
            None => {
                kill_and_reap(&mut self.child);
                panic!(
                    "{} still running {TERMINATE_TIMEOUT:?} after SIGTERM; killed. stderr:\n{}",
                    self.program,
                    self.stderr.all()
                );
            }
        }
    }

    /// Waits up to `timeout` for the process to exit on its own; its exit
    /// status, or `None` while it still runs.
    ///
    /// # Panics
    ///
    /// When the process cannot be waited for.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => return None,
                Err(e) => panic!("waiting for {}: {e}", self.program),
            }
        }
    }

    /// Whether the process has not exited yet.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the daemon has printed on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr.so_far()
    }

    /// Waits until the daemon's stderr holds `needle`.
    ///
    /// # Panics
    ///
    /// When it does not within [`LOG_TIMEOUT`], with the log so far.
    pub fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + LOG_TIMEOUT;
        while !self.stderr_so_far().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{}: no {needle:?} in the log:\n{}",
                self.program,
                self.stderr_so_far()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The text of the daemon's `/metrics`, from its `admin` endpoint.
    ///
    /// # Panics
    ///
    /// When the endpoint does not answer.
    pub fn metrics(&self) -> String {
        let admin = self.addr("admin");
        telemetry::http_get(admin, "/metrics", Duration::from_secs(5))
            .map(|(_, body)| body)
            .unwrap_or_else(|e| panic!("{}: GET http://{admin}/metrics: {e}", self.program))
    }

    /// The sum of the daemon's metric `name` over the series with `labels`
    /// (`""`: all of them), or `None` when it has no such metric.
    pub fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        telemetry::metric_sum(&self.metrics(), name, labels)
    }
}

/// Tests share daemons between threads (e.g. `std::thread::scope`).
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Daemon>();
};

impl Drop for Daemon {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_fields() {
        let fields = parse_ready_line(
            "ready server=S mode=msync admin=127.0.0.1:1234 nic.n0=127.0.0.1:5678 nic.n1=[::1]:9",
        )
        .unwrap();
        assert_eq!(fields.len(), 5);
        assert_eq!(fields["server"], "S");
        assert_eq!(fields["mode"], "msync");
        assert_eq!(fields["nic.n0"], "127.0.0.1:5678");
        assert_eq!(fields["nic.n1"], "[::1]:9");
    }

    #[test]
    fn ready_line_values_may_be_empty_or_contain_equals() {
        let fields = parse_ready_line("ready device=A  note= expr=a=b").unwrap();
        assert_eq!(fields["device"], "A");
        assert_eq!(fields["note"], "");
        assert_eq!(fields["expr"], "a=b");
    }

    #[test]
    fn bad_ready_lines_are_explained() {
        for (line, needle) in [
            ("starting server=S", "not a ready line"),
            ("ready server=S junk", "\"junk\" is not key=value"),
            ("ready =x", "has no key"),
            ("ready a=1 a=2", "\"a\" appears twice"),
        ] {
            let err = parse_ready_line(line).unwrap_err();
            assert!(err.contains(needle), "{line:?}: {err}");
        }
    }

    fn shell(script: &str) -> DaemonSpec {
        DaemonSpec::new("/bin/sh").args(["-c", script])
    }

    #[test]
    fn spawn_waits_for_the_ready_line() {
        let mut daemon = Daemon::spawn(
            shell("echo warming up; echo 'to stderr' >&2; echo ready port=127.0.0.1:7 x=$X; exec sleep 60")
                .env("X", "from-env"),
        )
        .unwrap();
        assert_eq!(daemon.field("x"), "from-env");
        assert_eq!(daemon.addr("port"), "127.0.0.1:7".parse().unwrap());
        assert!(daemon.ready_line().starts_with("ready port="));
        assert!(daemon.is_running());
        let (status, stderr) = daemon.terminate();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGTERM)
        );
        assert_eq!(stderr, "to stderr\n");
    }

    #[test]
    fn early_exit_returns_stderr() {
        let err = Daemon::spawn(shell("echo 'bad config: no server' >&2; exit 1")).unwrap_err();
        assert_eq!(err, "bad config: no server\n");
        let err = Daemon::spawn(shell("exit 3")).unwrap_err();
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(err.contains("nothing on stderr"), "{err}");
    }

    #[test]
    fn silence_times_out() {
        // The daemon would mark its natural end in `finished`: a spawn that
        // waited for it instead of stopping it at the ready timeout would
        // leave the mark.
        let dir = tempfile::tempdir().unwrap();
        let finished = dir.path().join("finished");
        let err = Daemon::spawn(
            shell("echo 'still loading' >&2; sleep 5 </dev/null >/dev/null 2>&1; touch \"$MARK\"")
                .env("MARK", finished.to_str().unwrap())
                .ready_timeout(Duration::from_millis(300)),
        )
        .unwrap_err();
        assert!(err.starts_with("still loading\n"), "{err}");
        assert!(err.contains("no ready line within 300ms"), "{err}");
        assert!(!finished.exists(), "spawn waited for the daemon to end");
    }

    #[test]
    fn missing_program_is_reported() {
        let err = Daemon::spawn(DaemonSpec::new("/nonexistent/daemon")).unwrap_err();
        assert!(err.contains("cannot start /nonexistent/daemon"), "{err}");
    }

    #[test]
    #[should_panic(expected = "no \"nic.n9\" in the ready line")]
    fn missing_field_panics_with_the_line() {
        let daemon = Daemon::spawn(shell("echo ready a=1; exec sleep 60")).unwrap();
        daemon.field("nic.n9");
    }

    #[test]
    fn kill9_and_drop_reap_the_process() {
        let daemon = Daemon::spawn(shell("echo ready a=1; exec sleep 60")).unwrap();
        let pid = i32::try_from(daemon.pid()).unwrap();
        daemon.kill9();
        // SAFETY: signal 0 only checks whether the pid exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "reaped, so gone");

        let daemon = Daemon::spawn(shell("echo ready a=1; exec sleep 60")).unwrap();
        let pid = i32::try_from(daemon.pid()).unwrap();
        drop(daemon);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "reaped, so gone");
    }

    #[test]
    fn a_chatty_daemon_never_blocks_on_its_pipes() {
        // 1 MiB on each pipe, far beyond the 64 KiB a pipe buffers.
        let mut daemon = Daemon::spawn(shell(
            "echo ready a=1; head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; echo done >&2; exec sleep 60",
        ))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !daemon.stderr_so_far().ends_with("done\n") {
            assert!(Instant::now() < deadline, "the daemon is stuck");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(daemon.is_running());
    }
}
