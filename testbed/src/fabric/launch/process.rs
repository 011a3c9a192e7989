//! A daemon process seen from outside: its ready line, its log's tail,
//! and its stop (SIGTERM, then SIGKILL after a limit).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Reads the `ready key=value …` line a daemon prints on stdout.
pub(super) fn wait_ready(
    child: &mut Child,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, String> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("ready ") {
                let fields = rest
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                let _ = tx.send(fields);
                break;
            }
        }
        // Keep draining so the daemon never blocks on a full pipe.
        for _ in lines {}
    });
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(fields) = rx.recv_timeout(Duration::from_millis(50)) {
            return Ok(fields);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}"));
        }
        if Instant::now() >= deadline {
            return Err(format!("no ready line within {timeout:?}"));
        }
    }
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends SIGTERM to a child.
pub(super) fn terminate(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Waits for a child to exit, killing it after `limit`.
pub(super) fn wait_or_kill(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                return child.wait().ok().filter(|_| false);
            }
        }
    }
}
