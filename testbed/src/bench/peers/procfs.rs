//! What `/proc` says of a process: CPU time, resident memory, listening
//! sockets.

use std::ffi::OsStr;
use std::io;

use super::PeerError;
use super::output::tail;

/// CPU seconds (user + system, all threads) process `pid` has used so far,
/// from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Result<f64, PeerError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("read {path}: {e}")))?;
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    parse_proc_stat(&text, ticks).ok_or_else(|| PeerError::Parse {
        program: path,
        what: "utime and stime".into(),
        output_tail: tail(&text),
    })
}

/// The resident set of process `pid` in bytes (`VmRSS` of
/// `/proc/PID/status`).
pub fn resident_bytes(pid: u32) -> Result<u64, PeerError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("read {path}: {e}")))?;
    parse_vm_rss(&text).ok_or_else(|| PeerError::Parse {
        program: path,
        what: "VmRSS".into(),
        output_tail: tail(&text),
    })
}

/// `VmRSS:   1234 kB` → 1234 × 1024.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next()? == "kB").then_some(kib * 1024)
}

/// (utime + stime) / `ticks_per_second` from the text of `/proc/PID/stat`;
/// the command name in parentheses may hold spaces and parentheses.
pub fn parse_proc_stat(text: &str, ticks_per_second: f64) -> Option<f64> {
    let (_, rest) = text.rsplit_once(')')?;
    // After the name: state (field 3), …, utime (14), stime (15).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

// ---------------------------------------------------------------------------
// Ports and readiness.

/// The inodes of the listening TCP sockets on `port` in the text of
/// `/proc/net/tcp` or `/proc/net/tcp6`.
pub fn listening_inodes(proc_net_tcp: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
            let local_port = u16::from_str_radix(local_port, 16).ok()?;
            (local_port == port && *fields.get(3)? == LISTEN)
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Whether process `pid` holds a socket listening on TCP `port`.
pub(super) fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| wanted.iter().any(|w| target.as_os_str() == OsStr::new(w)))
}
