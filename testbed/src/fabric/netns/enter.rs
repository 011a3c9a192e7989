//! Running programs and closures inside a namespace.

use std::io;
use std::path::Path;
use std::process::Command;

use super::ip::run_ip;
use super::{NETNS_DIRS, NetnsError};

/// A command that runs `program` inside namespace `ns`
/// (`ip netns exec NS program`); add its arguments to the result.
pub fn command_in(ns: &str, program: &Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}

/// The processes running inside namespace `ns` (`ip netns pids`).
pub fn namespace_pids(ns: &str) -> Result<Vec<u32>, NetnsError> {
    let out = run_ip(&["netns", "pids", ns])?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Opens the file of namespace `ns`.
pub(super) fn open_namespace(ns: &str) -> Result<std::fs::File, NetnsError> {
    let file = NETNS_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(ns))
        .find(|p| p.exists())
        .ok_or_else(|| NetnsError::Namespace {
            name: ns.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such network namespace"),
        })?;
    std::fs::File::open(&file).map_err(|source| NetnsError::Namespace {
        name: ns.to_owned(),
        source,
    })
}

/// Moves the calling thread into namespace `ns`. Sockets it opens from then
/// on, and threads and processes it starts, belong to `ns`.
pub fn enter(ns: &str) -> Result<(), NetnsError> {
    enter_file(&open_namespace(ns)?).map_err(|source| NetnsError::Namespace {
        name: ns.to_owned(),
        source,
    })
}

/// Moves the calling thread into the network namespace `file` refers to
/// (a `/run/netns` entry or a `/proc/…/ns/net` file).
pub fn enter_file(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `file` is an open namespace file descriptor that lives until
    // after the call; setns only changes this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a fresh thread that has entered namespace `ns` and returns its
/// result. Sockets `f` creates belong to `ns` for their whole life, so they
/// may be returned and used from any thread. A panic in `f` is resumed here.
pub fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            enter(ns)?;
            Ok(f())
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
