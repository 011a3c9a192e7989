//! Running iproute2: single commands, `ip -batch` files in parallel, and
//! what the root namespace already holds.

use std::io;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};

use super::NetnsError;

pub(super) fn in_block(addr: Ipv4Addr, block: u32) -> bool {
    u32::from(addr) & !1023 == block
}

/// Spawns `ip ARGS` with stdin, stdout and stderr piped.
pub(super) fn spawn_ip(args: &[&str]) -> Result<Child, NetnsError> {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                NetnsError::Unsupported(
                    "the `ip` command (iproute2) is not installed; install it with \
                     `apt-get install iproute2`"
                        .to_owned(),
                )
            } else {
                NetnsError::Io(e)
            }
        })
}

/// Feeds `input` to a spawned `ip` and waits; `lines` maps batch line numbers
/// in its error messages back to the commands.
pub(super) fn finish_ip(
    mut child: Child,
    args: &[&str],
    input: Option<&str>,
    lines: &[String],
) -> Result<String, NetnsError> {
    if let Some(mut stdin) = child.stdin.take()
        && let Some(input) = input
    {
        // A write error means ip exited early; its status tells why.
        let _ = stdin.write_all(input.as_bytes());
    }
    let output = child.wait_with_output().map_err(NetnsError::Io)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut command = format!("ip {}", args.join(" "));
    let failed_line = stderr.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Command failed -:")
            .and_then(|n| n.trim().parse::<usize>().ok())
    });
    // `ip -batch` names the failing line ("Command failed -:N") except for
    // arguments it cannot parse; then find the line with the quoted argument.
    let failed_line = failed_line.or_else(|| {
        stderr
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|quoted| !quoted.is_empty())
            .find_map(|quoted| {
                lines
                    .iter()
                    .position(|l| l.split_whitespace().any(|w| w == quoted))
                    .map(|i| i + 1)
            })
    });
    if let Some(n) = failed_line
        && let Some(line) = n.checked_sub(1).and_then(|i| lines.get(i))
    {
        command = format!("{command} (line {n}: {line})");
    }
    Err(NetnsError::Command {
        command,
        status: output.status.code(),
        stderr,
    })
}

/// Runs `ip ARGS` and returns its stdout.
pub(super) fn run_ip(args: &[&str]) -> Result<String, NetnsError> {
    let child = spawn_ip(args)?;
    finish_ip(child, args, None, &[])
}

/// A batch of `ip` commands for one namespace (`None`: the root namespace).
pub(super) struct Batch {
    pub(super) ns: Option<String>,
    pub(super) lines: Vec<String>,
}

impl Batch {
    pub(super) fn new(ns: Option<&str>) -> Self {
        Self {
            ns: ns.map(str::to_owned),
            lines: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, line: String) {
        self.lines.push(line);
    }

    fn args(&self, force: bool) -> Vec<&str> {
        let mut args = Vec::new();
        if let Some(ns) = &self.ns {
            args.extend(["-n", ns.as_str()]);
        }
        if force {
            args.push("-force");
        }
        args.extend(["-batch", "-"]);
        args
    }

    fn spawn(&self, force: bool) -> Result<Child, NetnsError> {
        spawn_ip(&self.args(force))
    }

    fn finish(&self, child: Child, force: bool) -> Result<(), NetnsError> {
        let mut input = self.lines.join("\n");
        input.push('\n');
        finish_ip(child, &self.args(force), Some(&input), &self.lines).map(drop)
    }

    pub(super) fn run(&self, force: bool) -> Result<(), NetnsError> {
        if self.lines.is_empty() {
            return Ok(());
        }
        let child = self.spawn(force)?;
        self.finish(child, force)
    }
}

/// Runs batches side by side; the first error wins, but all are waited for.
pub(super) fn run_parallel(batches: &[Batch]) -> Result<(), NetnsError> {
    let mut running = Vec::new();
    let mut first_error = None;
    for batch in batches.iter().filter(|b| !b.lines.is_empty()) {
        match batch.spawn(false) {
            Ok(child) => running.push((batch, child)),
            Err(e) => {
                first_error.get_or_insert(e);
                break;
            }
        }
    }
    for (batch, child) in running {
        if let Err(e) = batch.finish(child, false) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The names `ip netns list` shows.
pub fn list_namespaces() -> Result<Vec<String>, NetnsError> {
    let out = run_ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// The interface names of the root namespace.
pub(super) fn root_links() -> Result<Vec<String>, NetnsError> {
    run_ip(&["-o", "link", "show"]).map(|out| link_names(&out))
}

/// The interface names in `ip -o link show` output.
pub(super) fn link_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| {
            let n = n.trim_end_matches(':');
            n.split('@').next().unwrap_or(n).to_owned()
        })
        .collect()
}

/// The IPv4 addresses of the root namespace.
pub(super) fn root_addresses() -> Result<Vec<Ipv4Addr>, NetnsError> {
    let out = run_ip(&["-o", "-4", "addr", "show"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// The network (`a.b.c.0/nn`) of an address with prefix length.
pub(super) fn network_of(cidr: &str) -> Option<String> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|&l| l <= 32)?;
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    Some(format!("{}/{len}", Ipv4Addr::from(u32::from(addr) & mask)))
}

/// The bare address of `a.b.c.d/nn`.
pub(super) fn addr_only(cidr: &str) -> &str {
    cidr.split('/').next().unwrap_or(cidr)
}
