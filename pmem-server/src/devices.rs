//! Where each PMEM device of a server keeps its regions, and which NUMA
//! node its memory is on.
//!
//! A device of the topology may give a `path`:
//!
//! - none: its region files live in the server's data directory;
//! - a directory (e.g. an fsdax mount, ext4 `-o dax`): its region files
//!   live there;
//! - a device DAX character device (`/dev/daxX.Y`): its regions are laid
//!   out one after another in the device, each at an offset aligned to the
//!   device's `align` (2 MiB when sysfs does not say), each the same 4096-byte
//!   header and data as a region file ([`devdax_slots`]).
//!
//! [`ServerDevices::resolve`] looks every device up at start (sysfs and
//! `/proc/self/mountinfo`, under injectable roots, see [`SysRoots`]) and
//! fails on a device that cannot hold its regions; the server opens each
//! region where the result says
//! ([`RegionFile::open_on`](crate::region_file::RegionFile::open_on)).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use topology::{PmemDeviceId, RegionId, Server, SocketId};

use crate::region_format::HEADER_LEN;

/// Used when sysfs gives no alignment for a device DAX device.
pub const DEFAULT_DEVDAX_ALIGN: u64 = 2 << 20;

/// The roots of sysfs and procfs, so tests can use fake trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoots {
    /// Where sysfs is (`/sys`).
    pub sys: PathBuf,
    /// Where procfs is (`/proc`).
    pub proc: PathBuf,
    /// Accept a regular file where a device DAX character device is named
    /// (tests only: such a mapping is not durable by cache-line write-back).
    pub(crate) regular_files_as_devdax: bool,
}

impl SysRoots {
    /// The machine's own `/sys` and `/proc`.
    pub fn host() -> SysRoots {
        SysRoots::at("/sys", "/proc")
    }

    /// Fake trees at `sys` and `proc`.
    pub fn at(sys: impl Into<PathBuf>, proc: impl Into<PathBuf>) -> SysRoots {
        SysRoots {
            sys: sys.into(),
            proc: proc.into(),
            regular_files_as_devdax: false,
        }
    }
}

/// Why a server's devices cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The device's path cannot be examined.
    #[error("PMEM device {device} of socket {socket}: cannot use {path}")]
    Path {
        /// The device.
        device: PmemDeviceId,
        /// Its socket.
        socket: SocketId,
        /// The path the topology gives.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The path is neither a directory nor a character device.
    #[error(
        "PMEM device {device} of socket {socket}: {path} is neither a directory nor a device \
         DAX character device"
    )]
    NotADevice {
        /// The device.
        device: PmemDeviceId,
        /// Its socket.
        socket: SocketId,
        /// The path.
        path: PathBuf,
    },
    /// A sysfs attribute of a device DAX device is missing or unreadable.
    #[error("PMEM device {device}: cannot read {attribute} of {path}")]
    Sysfs {
        /// The device.
        device: PmemDeviceId,
        /// The character device.
        path: PathBuf,
        /// The sysfs file.
        attribute: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The device cannot hold its regions.
    #[error(
        "PMEM device {device} ({path}) holds {size} bytes but its {regions} region(s) need \
         {needed}: each takes its size plus a {HEADER_LEN}-byte header, rounded up to the \
         device's {align}-byte alignment; shrink the regions or give the device more memory"
    )]
    TooSmall {
        /// The device.
        device: PmemDeviceId,
        /// The character device.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// How many regions it should hold.
        regions: usize,
        /// Bytes they need (`None` beyond 2^64).
        needed: Needed,
        /// The device's alignment.
        align: u64,
    },
}

/// Bytes a device's regions need, which may exceed 64 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needed(pub Option<u64>);

impl std::fmt::Display for Needed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(bytes) => write!(f, "{bytes}"),
            None => f.write_str("more than 2^64 bytes"),
        }
    }
}

/// One region's place in a device DAX device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The region.
    pub region: RegionId,
    /// Where its header starts in the device; a multiple of the alignment.
    pub offset: u64,
    /// Bytes mapped for it: header and data rounded up to the alignment.
    pub map_len: u64,
}

/// Where a device keeps its regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Medium {
    /// Region files in the server's data directory (no `path`).
    DataDir(PathBuf),
    /// Region files in a directory of the device's own.
    Directory(PathBuf),
    /// Regions in a device DAX character device.
    DevDax(DevDax),
}

/// A device DAX device as sysfs describes it, with its regions' slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevDax {
    /// The character device.
    pub path: PathBuf,
    /// Its kernel name, `daxX.Y`.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its mapping alignment in bytes.
    pub align: u64,
    /// The regions, in topology order.
    pub slots: Vec<Slot>,
}

/// One PMEM device of the server, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its socket.
    pub socket: SocketId,
    /// Its id.
    pub id: PmemDeviceId,
    /// Where its regions are.
    pub medium: Medium,
    /// For a directory: the block device its filesystem is on, if found.
    pub block_device: Option<String>,
    /// The NUMA node of its memory, if found.
    pub numa_node: Option<u32>,
    /// How many regions it holds.
    pub regions: usize,
}

/// Every PMEM device of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerDevices {
    /// The server's data directory.
    pub data_dir: PathBuf,
    /// Its devices in topology order.
    pub devices: Vec<Device>,
}

/// Round `value` up to a multiple of `align` (non-zero), `None` on overflow.
fn align_up(value: u64, align: u64) -> Option<u64> {
    value.checked_next_multiple_of(align)
}

/// Where regions of `lens` bytes go in a device DAX device of alignment
/// `align` (a power of two): each slot starts where the one before ends,
/// holds the header and the data, and is rounded up to `align`. Returns
/// each slot's `(offset, map_len)` and the bytes they need together, or
/// `None` when that exceeds 2^64 or `align` is not a power of two.
pub fn devdax_slots(lens: &[u64], align: u64) -> Option<(Vec<(u64, u64)>, u64)> {
    if !align.is_power_of_two() {
        return None;
    }
    let mut offset = 0u64;
    let mut slots = Vec::with_capacity(lens.len());
    for &len in lens {
        let map_len = align_up(HEADER_LEN.checked_add(len)?, align)?;
        slots.push((offset, map_len));
        offset = offset.checked_add(map_len)?;
    }
    Some((slots, offset))
}

/// Reads a sysfs attribute as a trimmed string.
fn read_attr(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_owned())
}

/// Parses a sysfs number (decimal, or `0x` hexadecimal).
fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The NUMA node sysfs gives at `dir` or the nearest ancestor that says,
/// following symlinks but not leaving `sys`. `-1` (no node) keeps looking.
pub fn numa_node_near(dir: &Path, sys: &Path) -> Option<u32> {
    let sys = fs::canonicalize(sys).ok()?;
    let dir = fs::canonicalize(dir).ok()?;
    for at in dir.ancestors() {
        if !at.starts_with(&sys) {
            break;
        }
        for file in ["numa_node", "device/numa_node"] {
            let node = read_attr(&at.join(file))
                .ok()
                .and_then(|t| t.parse::<i64>().ok());
            if let Some(node) = node
                && let Ok(node) = u32::try_from(node)
            {
                return Some(node);
            }
        }
    }
    None
}

/// One line of `/proc/self/mountinfo`: the mount point and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// The filesystem type.
    pub fstype: String,
    /// What is mounted (e.g. `/dev/pmem0`).
    pub source: String,
    /// Mount and superblock options, comma-separated.
    pub options: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')));
        match octal.and_then(|n| u8::try_from(n).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            let head: Vec<&str> = head.split(' ').collect();
            let mut tail = tail.split(' ');
            let (fstype, source) = (tail.next()?, tail.next()?);
            let super_options = tail.next().unwrap_or("");
            Some(Mount {
                point: PathBuf::from(unescape(head.get(4)?)),
                fstype: unescape(fstype),
                source: unescape(source),
                options: format!("{},{super_options}", head.get(5)?),
            })
        })
        .collect()
}

/// The mount `path` (absolute, symlinks resolved) is on: the last-mounted
/// of those with the longest mount point that contains it.
pub fn mount_of<'m>(mounts: &'m [Mount], path: &Path) -> Option<&'m Mount> {
    let mut best: Option<&Mount> = None;
    for mount in mounts {
        let longer =
            best.is_none_or(|b| mount.point.components().count() >= b.point.components().count());
        if path.starts_with(&mount.point) && longer {
            best = Some(mount);
        }
    }
    best
}

/// `path` with symlinks resolved as far as it exists; the rest appended.
fn canonical_existing(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut at = absolute.as_path();
    loop {
        if let Ok(real) = fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p: PathBuf, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                at = parent;
            }
            _ => return absolute,
        }
    }
}

/// The block device (kernel name, e.g. `pmem0`) under the filesystem that
/// holds directory `dir`, and its NUMA node.
fn directory_device(dir: &Path, roots: &SysRoots) -> (Option<String>, Option<u32>) {
    let Ok(text) = fs::read_to_string(roots.proc.join("self/mountinfo")) else {
        return (None, None);
    };
    let mounts = parse_mountinfo(&text);
    let Some(mount) = mount_of(&mounts, &canonical_existing(dir)) else {
        return (None, None);
    };
    let Some(name) = mount.source.strip_prefix("/dev/") else {
        return (None, None);
    };
    let name = name.to_owned();
    let node = [
        roots.sys.join("block").join(&name),
        roots.sys.join("class/block").join(&name),
    ]
    .iter()
    .find(|p| p.exists())
    .and_then(|p| numa_node_near(p, &roots.sys));
    (Some(name), node)
}

/// The sysfs folder of device DAX device `name`.
fn dax_sysfs(roots: &SysRoots, name: &str) -> PathBuf {
    roots.sys.join("bus/dax/devices").join(name)
}

/// A device DAX device's alignment: sysfs `align`, else
/// [`DEFAULT_DEVDAX_ALIGN`]; a value that is not a power of two of at least
/// 4096 is an error.
fn dax_align(roots: &SysRoots, name: &str) -> io::Result<u64> {
    match read_attr(&dax_sysfs(roots, name).join("align")) {
        Ok(text) => parse_number(&text)
            .filter(|a| a.is_power_of_two() && *a >= 4096)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("alignment {text:?} is not a power of two of at least 4096"),
                )
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(DEFAULT_DEVDAX_ALIGN),
        Err(e) => Err(e),
    }
}

fn dax_size(roots: &SysRoots, name: &str) -> io::Result<u64> {
    let text = read_attr(&dax_sysfs(roots, name).join("size"))?;
    parse_number(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("size {text:?} is not a number"),
        )
    })
}

impl ServerDevices {
    /// Resolves every PMEM device of `server`: where its regions go, its
    /// NUMA node and, for device DAX, its size, alignment and slots.
    pub fn resolve(
        server: &Server,
        data_dir: &Path,
        roots: &SysRoots,
    ) -> Result<ServerDevices, DeviceError> {
        Self::resolve_holding(server, &[], data_dir, roots)
    }

    /// [`ServerDevices::resolve`] for a server that also holds `backups`:
    /// on a device DAX device they take the slots after the device's own
    /// regions.
    pub fn resolve_holding(
        server: &Server,
        backups: &[crate::held::BackupPlace],
        data_dir: &Path,
        roots: &SysRoots,
    ) -> Result<ServerDevices, DeviceError> {
        let mut devices = Vec::new();
        for socket in &server.sockets {
            for device in &socket.devices {
                let own = device
                    .regions
                    .iter()
                    .map(|r| (r.id.clone(), r.size.bytes()));
                let held = backups
                    .iter()
                    .filter(|b| b.socket == socket.id && b.device == device.id)
                    .map(|b| (b.region.clone(), b.len));
                let lens: Vec<(RegionId, u64)> = own.chain(held).collect();
                devices.push(resolve_one(
                    &socket.id,
                    &device.id,
                    device.path.as_deref().map(Path::new),
                    &lens,
                    data_dir,
                    roots,
                )?);
            }
        }
        Ok(ServerDevices {
            data_dir: data_dir.to_path_buf(),
            devices,
        })
    }

    /// The plan without a device path: every region file in `data_dir`.
    pub fn in_data_dir(data_dir: &Path) -> ServerDevices {
        ServerDevices {
            data_dir: data_dir.to_path_buf(),
            devices: Vec::new(),
        }
    }

    /// Where the regions of device `device` of socket `socket` go; a device
    /// the plan does not know keeps them in the data directory.
    pub fn medium(&self, socket: &SocketId, device: &PmemDeviceId) -> Medium {
        self.devices
            .iter()
            .find(|d| &d.socket == socket && &d.id == device)
            .map_or_else(
                || Medium::DataDir(self.data_dir.clone()),
                |d| d.medium.clone(),
            )
    }

    /// The NUMA node of `socket`'s PMEM: the first of its devices whose
    /// node is known.
    pub fn socket_node(&self, socket: &SocketId) -> Option<u32> {
        self.devices
            .iter()
            .filter(|d| &d.socket == socket)
            .find_map(|d| d.numa_node)
    }

    /// One line per device for the start-up log, e.g. `pmem device pmem1
    /// of socket 1: /dev/dax1.0, devdax, NUMA node 1, 2 regions`.
    pub fn describe(&self) -> Vec<String> {
        self.devices.iter().map(Device::describe).collect()
    }

    /// Devices whose NUMA node differs from their socket's id, where that
    /// id is a number.
    pub fn warnings(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter_map(|d| {
                let socket: u32 = d.socket.as_str().parse().ok()?;
                let node = d.numa_node?;
                (socket != node).then(|| {
                    format!(
                        "pmem device {} of socket {socket} is on NUMA node {node}: its memory is \
                         not local to the socket the topology puts it on",
                        d.id
                    )
                })
            })
            .collect()
    }
}

impl Device {
    fn describe(&self) -> String {
        let (place, kind) = match &self.medium {
            Medium::DataDir(dir) => (
                format!("{} (data dir)", dir.display()),
                self.directory_kind(),
            ),
            Medium::Directory(dir) => (dir.display().to_string(), self.directory_kind()),
            Medium::DevDax(dax) => (dax.path.display().to_string(), "devdax".to_owned()),
        };
        let node = self.numa_node.map_or_else(
            || "NUMA node unknown".to_owned(),
            |n| format!("NUMA node {n}"),
        );
        let regions = match self.regions {
            1 => "1 region".to_owned(),
            n => format!("{n} regions"),
        };
        format!(
            "pmem device {} of socket {}: {place}, {kind}, {node}, {regions}",
            self.id, self.socket
        )
    }

    fn directory_kind(&self) -> String {
        match &self.block_device {
            Some(dev) if dev.starts_with("pmem") => format!("fsdax on {dev}"),
            Some(dev) => format!("files on {dev}"),
            None => "files".to_owned(),
        }
    }
}

fn resolve_one(
    socket: &SocketId,
    id: &PmemDeviceId,
    path: Option<&Path>,
    lens: &[(RegionId, u64)],
    data_dir: &Path,
    roots: &SysRoots,
) -> Result<Device, DeviceError> {
    let device = |medium, block_device, numa_node| Device {
        socket: socket.clone(),
        id: id.clone(),
        medium,
        block_device,
        numa_node,
        regions: lens.len(),
    };
    let Some(path) = path else {
        let (block, node) = directory_device(data_dir, roots);
        return Ok(device(Medium::DataDir(data_dir.to_path_buf()), block, node));
    };
    let path_err = |source| DeviceError::Path {
        device: id.clone(),
        socket: socket.clone(),
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(path_err)?;
    if meta.is_dir() {
        let (block, node) = directory_device(path, roots);
        return Ok(device(Medium::Directory(path.to_path_buf()), block, node));
    }
    use std::os::unix::fs::FileTypeExt;
    let devdax_ok = meta.file_type().is_char_device()
        || (roots.regular_files_as_devdax && meta.file_type().is_file());
    if !devdax_ok {
        return Err(DeviceError::NotADevice {
            device: id.clone(),
            socket: socket.clone(),
            path: path.to_path_buf(),
        });
    }
    // The kernel name (daxX.Y) of the device, also behind a symlink.
    let real = fs::canonicalize(path).map_err(path_err)?;
    let name = real
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            path_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no device name",
            ))
        })?
        .to_owned();
    let sysfs = dax_sysfs(roots, &name);
    let sysfs_err = |attribute: &str, source| DeviceError::Sysfs {
        device: id.clone(),
        path: path.to_path_buf(),
        attribute: sysfs.join(attribute),
        source,
    };
    let size = dax_size(roots, &name).map_err(|e| sysfs_err("size", e))?;
    let align = dax_align(roots, &name).map_err(|e| sysfs_err("align", e))?;
    let sizes: Vec<u64> = lens.iter().map(|(_, len)| *len).collect();
    let planned = devdax_slots(&sizes, align);
    let fits = planned.as_ref().is_some_and(|(_, needed)| *needed <= size);
    let Some((slots, _)) = planned.filter(|_| fits) else {
        return Err(DeviceError::TooSmall {
            device: id.clone(),
            path: path.to_path_buf(),
            size,
            regions: lens.len(),
            needed: Needed(devdax_slots(&sizes, align).map(|(_, n)| n)),
            align,
        });
    };
    let slots = slots
        .into_iter()
        .zip(lens)
        .map(|((offset, map_len), (region, _))| Slot {
            region: region.clone(),
            offset,
            map_len,
        })
        .collect();
    let node = numa_node_near(&sysfs, &roots.sys);
    let dax = DevDax {
        path: path.to_path_buf(),
        name,
        size,
        align,
        slots,
    };
    Ok(device(Medium::DevDax(dax), None, node))
}

#[cfg(test)]
mod tests;
