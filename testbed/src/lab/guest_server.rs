//! A PMEM server of a lab fabric that runs in a QEMU guest of its own, on
//! emulated NVDIMMs, with the guest's rxe as its RNIC.
//!
//! In lab mode a server whose NICs listen on the lab's bridge (10.77.0.0/24,
//! other than the host's 10.77.0.100) gets a guest at that address. Each of
//! its PMEM devices that names a `path` gets an NVDIMM of its own, in
//! socket order, NVDIMM `i` on NUMA node `i` mod the number of sockets
//! (one node per socket). A device at `/dev/daxI.0` is made device DAX, any
//! other path an fsdax namespace with ext4 mounted there with `-o dax`;
//! the first boot makes them, later boots find them (the info blocks are on
//! the NVDIMMs). The server's data directory (exactly-once window,
//! manifest) is `state/` on the first fsdax mount, so it survives a power
//! cut as the regions do.
//!
//! Killing the daemon cuts the guest's power (SIGKILL to QEMU); a restart
//! boots it again on the same NVDIMMs. Stopping it asks the server in the
//! guest to drain (SIGTERM) through a file in a shared folder, and the
//! guest powers off once it has exited.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use topology::{Server, Topology};

use crate::lab::guest;
use crate::lab::{GuestStorage, LabNet};

/// The host's address on the lab bridge (the devices' control ports).
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 100);
/// Smallest NVDIMM made.
const MIN_NVDIMM: u64 = 64 << 20;
/// NVDIMM sizes are multiples of this: libnvdimm wants a namespace aligned
/// to the region's 16 MiB alignment.
const NVDIMM_ALIGN: u64 = 32 << 20;

/// Why a server cannot run in a lab guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestServerError {
    /// A device path the guest cannot make.
    #[error(
        "server {server}: PMEM device {device} is NVDIMM {index} in its lab guest, so its \
         device DAX is /dev/dax{index}.0, not {path}"
    )]
    DaxPath {
        /// The server.
        server: String,
        /// The device.
        device: String,
        /// Its NVDIMM index.
        index: usize,
        /// The path it names.
        path: String,
    },
    /// No place for the server's own state.
    #[error(
        "server {server}: a lab guest server needs a PMEM device with a directory path (an \
         fsdax mount) to keep its exactly-once window and manifest on"
    )]
    NoStateDevice {
        /// The server.
        server: String,
    },
    /// Its boot script or an NVDIMM file cannot be made.
    #[error("server {server}: cannot prepare its guest")]
    Guest {
        /// The server.
        server: String,
        /// Why.
        #[source]
        source: guest::GuestError,
    },
    /// Its files cannot be written.
    #[error("server {server}: cannot prepare its guest in {dir}")]
    Io {
        /// The server.
        server: String,
        /// Where.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One guest server's boot material.
#[derive(Debug, Clone)]
pub struct GuestServer {
    script: PathBuf,
    nvdimms: Vec<PathBuf>,
    nodes: usize,
    address: String,
    pidfile: PathBuf,
    stopfile: PathBuf,
    console: PathBuf,
    shares: Vec<PathBuf>,
}

/// The address a lab server's guest takes, if `server` runs in one.
pub fn guest_address(server: &Server) -> Option<Ipv4Addr> {
    let ip = server
        .nics
        .first()?
        .listen
        .parse::<std::net::SocketAddrV4>()
        .ok()?
        .ip()
        .to_owned();
    let [a, b, c, _] = ip.octets();
    ((a, b, c) == (10, 77, 0) && ip != HOST_IP).then_some(ip)
}

/// Where a guest server's pieces are on the host.
#[derive(Debug, Clone, Copy)]
pub struct GuestPaths<'a> {
    /// The testbed executable (it runs the server in the guest).
    pub program: &'a Path,
    /// The topology the daemons read.
    pub topology: &'a Path,
    /// Where the server's NVDIMM files are kept (across restarts).
    pub data_dir: &'a Path,
    /// The run's folder (boot script, console log).
    pub run_dir: &'a Path,
    /// The key folder, with keys.
    pub secrets: Option<&'a Path>,
}

impl GuestServer {
    /// Writes the boot script of `server` (which runs in a guest at `ip`)
    /// and makes its NVDIMM files; `args` are the server's daemon arguments
    /// after `--data-dir`.
    pub fn prepare(
        topology: &Topology,
        server: &Server,
        ip: Ipv4Addr,
        paths: GuestPaths<'_>,
        args: &[String],
    ) -> Result<GuestServer, GuestServerError> {
        let GuestPaths {
            program,
            topology: topology_path,
            data_dir,
            run_dir,
            secrets,
        } = paths;
        let id = server.id.to_string();
        let dir = run_dir.join("guests").join(&id);
        let io = |source| GuestServerError::Io {
            server: id.clone(),
            dir: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        std::fs::create_dir_all(data_dir).map_err(io)?;
        let layout_sizes = |device: &topology::PmemDevice| -> u64 {
            device
                .regions
                .iter()
                .map(|r| r.size.0.next_multiple_of(2 << 20) + (2 << 20))
                .sum()
        };
        let mut setup = String::new();
        let mut nvdimms = Vec::new();
        let mut state = None;
        let devices = server
            .sockets
            .iter()
            .flat_map(|s| s.devices.iter())
            .filter_map(|d| d.path.as_deref().map(|p| (d, p)));
        for (index, (device, path)) in devices.enumerate() {
            let file = data_dir.join(format!("nvdimm{index}.img"));
            let size = (layout_sizes(device) * 2 + (32 << 20))
                .max(MIN_NVDIMM)
                .next_multiple_of(NVDIMM_ALIGN);
            if !file.exists() {
                guest::make_nvdimm(&file, size).map_err(|source| GuestServerError::Guest {
                    server: id.clone(),
                    source,
                })?;
            }
            nvdimms.push(file);
            if path.starts_with("/dev/dax") {
                if path != format!("/dev/dax{index}.0") {
                    return Err(GuestServerError::DaxPath {
                        server: id,
                        device: device.id.to_string(),
                        index,
                        path: path.to_owned(),
                    });
                }
                setup.push_str(&format!(
                    "wait_for /dev/pmem{index} /dev/dax{index}.0\n\
                     [ -e /dev/dax{index}.0 ] || ndctl create-namespace --force --reconfig \
                     namespace{index}.0 --mode devdax --align 2M >/dev/null\n"
                ));
            } else {
                setup.push_str(&format!(
                    "wait_for /dev/pmem{index} /dev/pmem{index}\n\
                     if [ \"$(cat /sys/block/pmem{index}/queue/dax)\" != 1 ]; then\n\
                     \x20 ndctl create-namespace --force --reconfig namespace{index}.0 --mode fsdax \
                     --align 2M >/dev/null\n\
                     \x20 mkfs.ext4 -q -F -b 4096 /dev/pmem{index}\n\
                     fi\n\
                     mkdir -p {path}\n\
                     mount -t ext4 -o dax /dev/pmem{index} {path}\n"
                ));
                state.get_or_insert_with(|| format!("{path}/state"));
            }
        }
        let state = state.ok_or(GuestServerError::NoStateDevice { server: id.clone() })?;
        let stopfile = dir.join("stop");
        let pidfile = dir.join("qemu.pid");
        let script = dir.join("boot.sh");
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let body = format!(
            "# Written by testbed: server {id}'s lab guest ({name}).\n\
             set -e\n\
             wait_for() {{ i=0; while [ ! -e \"$1\" ] && [ ! -e \"$2\" ] && [ $i -lt 100 ]; do \
             sleep 0.1; i=$((i+1)); done; }}\n\
             {setup}\
             rm -f {stop}\n\
             {program} daemon pmem-server --config {topology} --server {id} --data-dir {state} \
             {args} &\n\
             pid=$!\n\
             set +e\n\
             while kill -0 $pid 2>/dev/null && [ ! -e {stop} ]; do sleep 0.2; done\n\
             kill -TERM $pid 2>/dev/null\n\
             wait $pid\n",
            name = topology.pool.name,
            stop = stopfile.display(),
            program = program.display(),
            topology = topology_path.display(),
            args = quoted.join(" "),
        );
        guest::write_script(&script, &body).map_err(|source| GuestServerError::Guest {
            server: id.clone(),
            source,
        })?;
        let mut shares = vec![run_dir.to_owned()];
        shares.extend(program.parent().map(Path::to_owned));
        shares.extend(topology_path.parent().map(Path::to_owned));
        shares.extend(secrets.map(Path::to_owned));
        shares.sort();
        shares.dedup();
        Ok(GuestServer {
            script,
            nvdimms,
            nodes: server.sockets.len().max(1),
            address: format!("{ip}/24"),
            pidfile,
            stopfile,
            console: run_dir.join("logs").join(format!("guest-server-{id}.log")),
            shares,
        })
    }

    /// The command that boots the guest and runs the server in it; its
    /// stdout is the guest's console (the server's ready line among it).
    pub fn command(&self, lab: &LabNet) -> Command {
        let shares: Vec<&Path> = self.shares.iter().map(PathBuf::as_path).collect();
        let nvdimms: Vec<&Path> = self.nvdimms.iter().map(PathBuf::as_path).collect();
        let storage = GuestStorage {
            disk: None,
            nvdimms: &nvdimms,
            nodes: self.nodes,
            pidfile: &self.pidfile,
            address: Some(&self.address),
        };
        let _ = std::fs::remove_file(&self.stopfile);
        lab.guest_with_storage(&self.script, &shares, &self.console, &storage)
    }

    /// Where the guest's console (the server's log among it) is copied.
    pub fn console(&self) -> &Path {
        &self.console
    }

    /// The last `lines` lines of the console that are not the kernel's or
    /// the lab's counters (the server's own output), without colours.
    pub fn console_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.console).unwrap_or_default();
        let kept: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with("PMEMLAB-COUNTER") && !l.trim_start().starts_with('['))
            .map(strip_colours)
            .collect();
        kept[kept.len().saturating_sub(lines)..].join("\n")
    }

    /// Cuts the guest's power: SIGKILL to its QEMU.
    pub fn power_cut(&self) {
        // No pid file: the guest is not running, so there is no power to
        // cut.
        let _ = guest::power_off(&self.pidfile);
    }

    /// Asks the server in the guest to drain and exit; the guest then
    /// powers off.
    pub fn ask_to_stop(&self) -> std::io::Result<()> {
        std::fs::write(&self.stopfile, b"stop\n")
    }
}

/// `line` without ANSI colour sequences (ESC [ … m).
fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_are_stripped() {
        assert_eq!(
            strip_colours("\u{1b}[2m2026\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m NIC n1: no"),
            "2026 ERROR NIC n1: no"
        );
    }
}
