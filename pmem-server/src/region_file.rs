//! Region files: one file per PMEM region, a header followed by the data;
//! on a device DAX device, the same header and data in the region's slot of
//! the device (see [`crate::devices`]).
//!
//! ```text
//! 0..8     magic       b"PMFABRGN"
//! 8..12    version     u32 (1)
//! 12..16   header_len  u32 (4096: data starts on its own page)
//! 16..24   size        u64 bytes of region data
//! 24..32   generation  u64, bumped every time a server opens the file
//! 32..40   key         u64 region key: random, made when the file is created
//! 40..44   index       u32 region index in the layout when last opened
//! 44..46   id_len      u16
//! 46..302  id          region id, UTF-8, at most 256 bytes
//! 504..512 checksum    first 8 bytes of SHA-256 over 0..504
//! ```
//!
//! The region key is this server's to make: it is drawn at random (never
//! 0) when the file is created, kept across restarts, and replaced only by
//! [`RegionFile::rotate_key`]. The topology does not hold it.
//!
//! On restart the server recognises its files and keeps their data. A file
//! whose header names another region or another size is refused; nothing is
//! ever reformatted unless the operator asks for it.
//!
//! Region files are fully allocated (`posix_fallocate`) when created and
//! when reopened, so a filesystem that cannot hold them fails at start with
//! the file and the shortfall, never later with SIGBUS on a write. The data
//! directory keeps a manifest (`regions.manifest`) of the regions it has
//! held: a listed region whose file is gone stops the server instead of
//! being recreated empty. The manifest stays in the data directory whatever
//! device holds a region (so an fsdax filesystem that is not mounted is
//! noticed): on device DAX, which has no files, a listed region whose slot
//! holds a blank (all-zero) header, as a recreated namespace does, stops the
//! server the same way. Before opening any region the server also compares
//! its regions with each other ([`crate::missing`]): a region that is gone
//! while others are present stops it even when the manifest is gone too,
//! until the operator names the region with `--create-missing` (or starts
//! over with `--format`).
//!
//! Device DAX has no read(2), write(2) or fallocate: the header is read and
//! written through the region's mapping and made durable by cache-line
//! write-back, and a region created there has its data zeroed (as a new file
//! would be).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use topology::{AccessKey, LayoutEntry};

use crate::block_sums::BlockSums;
use crate::devices::{DevDax, Medium, ServerDevices};
use crate::persist::{PersistError, PersistPolicy, PmemMap};

pub use crate::region_format::{HEADER_LEN, MAGIC, MAX_ID_LEN, VERSION};

const ENCODED_LEN: usize = 512;
const CHECKSUM_AT: usize = 504;

/// The identity and state recorded at the start of a region file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionHeader {
    /// The region's id.
    pub region_id: String,
    /// The region's index in the layout when the file was last opened.
    pub region_index: u32,
    /// Bytes of region data after the header.
    pub size: u64,
    /// How many times a server has opened (or formatted) the file.
    pub generation: u64,
    /// The region key requests must carry.
    pub key: AccessKey,
}

/// A region file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RegionFileError {
    /// An I/O call on the file failed.
    #[error("{path}: cannot {op}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The file does not start with the region magic.
    #[error("{path}: not a pmem-fabric region file (bad magic); use --format to recreate it")]
    NotARegionFile {
        /// The file.
        path: PathBuf,
    },
    /// The header was written by an unknown format version.
    #[error("{path}: unsupported region file version {version} (this server reads {VERSION})")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The header checksum does not match its contents.
    #[error("{path}: region header is corrupt (checksum mismatch)")]
    Corrupt {
        /// The file.
        path: PathBuf,
    },
    /// The header disagrees with the topology.
    #[error(
        "{path}: header {field} is {in_file} but the topology says {in_topology}; \
         refusing to start (use --format to recreate the region, losing its data)"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Which header field disagrees.
        field: &'static str,
        /// The value in the file.
        in_file: String,
        /// The value the topology gives.
        in_topology: String,
    },
    /// The file is shorter than its header says.
    #[error("{path}: file is {len} bytes, shorter than the {expected} bytes its header needs")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length header + data need.
        expected: u64,
    },
    /// The region id cannot be a file name or does not fit the header.
    #[error(
        "region id {id:?} cannot name a region file (at most {MAX_ID_LEN} bytes, no '/' or NUL)"
    )]
    BadId {
        /// The id.
        id: String,
    },
    /// The filesystem cannot hold the file.
    #[error(
        "{path}: the filesystem cannot hold the region file: it needs {needed} bytes, \
         {available} are free; free space, give the server another --data-dir, or shrink the region"
    )]
    NoSpace {
        /// The file.
        path: PathBuf,
        /// Bytes the file needs.
        needed: u64,
        /// Bytes free on its filesystem.
        available: u64,
    },
    /// A region the data directory held has lost its file.
    #[error(
        "{path}: region file is missing, but {manifest} says this data directory held it; \
         its data is gone unless the file is restored. Restore it, start with \
         --create-missing REGION to create just this region empty, or with --format to \
         recreate every region empty"
    )]
    Missing {
        /// The missing file.
        path: PathBuf,
        /// The manifest that lists it.
        manifest: PathBuf,
    },
    /// A region the data directory held has a blank header on its device
    /// DAX device.
    #[error(
        "{path}: the region's header on the device is blank, but {manifest} says this server \
         held the region; its data is gone (was the namespace recreated?). Restore it, start \
         with --create-missing REGION to create just this region empty, or with --format to \
         recreate every region empty"
    )]
    Blank {
        /// The device and the region's offset in it.
        path: PathBuf,
        /// The manifest that lists it.
        manifest: PathBuf,
    },
    /// The device plan has no place for the region.
    #[error("{path}: no slot for region {region:?} on this device")]
    NoSlot {
        /// The device.
        path: PathBuf,
        /// The region.
        region: String,
    },
    /// Mapping the file failed (the cause names the file).
    #[error("cannot map region file")]
    Map {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: PersistError,
    },
}

impl RegionFileError {
    /// Makes an I/O failure on the file at `path` into an error naming the
    /// file and the call (`op`: "open", "stat", …).
    fn io(path: &Path) -> impl Fn(&'static str, io::Error) -> Self + '_ {
        move |op, source| Self::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

fn checksum(bytes: &[u8]) -> [u8; 8] {
    let digest = Sha256::digest(bytes);
    let mut out = [0u8; 8];
    out.copy_from_slice(&digest[..8]);
    out
}

impl RegionHeader {
    /// The header's on-disk bytes.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut b = [0u8; ENCODED_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.key.get().to_le_bytes());
        b[40..44].copy_from_slice(&self.region_index.to_le_bytes());
        let id = &self.region_id.as_bytes()[..self.region_id.len().min(MAX_ID_LEN)];
        b[44..46].copy_from_slice(&(id.len() as u16).to_le_bytes());
        b[46..46 + id.len()].copy_from_slice(id);
        let sum = checksum(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&sum);
        b
    }

    /// Reads a header from the first bytes of `path`'s file.
    pub fn decode(path: &Path, b: &[u8; ENCODED_LEN]) -> Result<Self, RegionFileError> {
        let path = || path.to_path_buf();
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(v)
        };
        if b[0..8] != MAGIC {
            return Err(RegionFileError::NotARegionFile { path: path() });
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(RegionFileError::UnsupportedVersion {
                path: path(),
                version,
            });
        }
        if checksum(&b[..CHECKSUM_AT]) != b[CHECKSUM_AT..] {
            return Err(RegionFileError::Corrupt { path: path() });
        }
        let id_len = usize::from(u16::from_le_bytes([b[44], b[45]]));
        if id_len > MAX_ID_LEN || u64::from(u32_at(12)) != HEADER_LEN {
            return Err(RegionFileError::Corrupt { path: path() });
        }
        let region_id = std::str::from_utf8(&b[46..46 + id_len])
            .map_err(|_| RegionFileError::Corrupt { path: path() })?
            .to_owned();
        Ok(Self {
            region_id,
            region_index: u32_at(40),
            size: u64_at(16),
            generation: u64_at(24),
            key: AccessKey(u64_at(32)),
        })
    }
}

/// The file that holds a region in `data_dir`.
pub fn region_path(data_dir: &Path, region_id: &str) -> Result<PathBuf, RegionFileError> {
    let bad = region_id.is_empty()
        || region_id.len() > MAX_ID_LEN
        || region_id.contains(['/', '\0'])
        || region_id == "."
        || region_id == "..";
    if bad {
        return Err(RegionFileError::BadId {
            id: region_id.to_owned(),
        });
    }
    Ok(data_dir.join(format!("{region_id}.pmem")))
}

/// An open, mapped region file (or region slot of a device DAX device).
#[derive(Debug)]
pub struct RegionFile {
    /// Where the file is; for device DAX, the character device.
    pub path: PathBuf,
    /// Its header as of this open.
    pub header: RegionHeader,
    /// Whether this open created (or reformatted) the file.
    pub created: bool,
    /// The mapping of the whole file, header included.
    pub map: PmemMap,
    /// Checksums of the data's blocks, recorded and verified by scrubs.
    pub sums: BlockSums,
    /// Where the header is read and written.
    place: Place,
}

/// How a region's header is reached.
#[derive(Debug, Clone)]
enum Place {
    /// With pread/pwrite on the region file.
    File,
    /// Through the mapping (device DAX); `label` names the device and the
    /// region's offset in messages.
    Mapped { label: PathBuf },
}

/// Where a header is read and written: a file, or the start of a mapping
/// (made durable by [`PmemMap::persist`]).
enum HeaderAt<'a> {
    File(&'a File),
    Map(&'a PmemMap),
}

impl HeaderAt<'_> {
    /// The header's bytes.
    fn read(&self, path: &Path) -> Result<[u8; ENCODED_LEN], RegionFileError> {
        let mut raw = [0u8; ENCODED_LEN];
        match self {
            HeaderAt::File(file) => {
                file.read_exact_at(&mut raw, 0)
                    .map_err(|source| RegionFileError::Io {
                        path: path.to_path_buf(),
                        op: "read the header of",
                        source,
                    })?
            }
            HeaderAt::Map(map) => map
                .read(0, &mut raw)
                .map_err(|source| RegionFileError::Map {
                    path: path.to_path_buf(),
                    source,
                })?,
        }
        Ok(raw)
    }

    /// Writes `header` and makes it durable.
    fn write(&self, path: &Path, header: &RegionHeader) -> Result<(), RegionFileError> {
        match self {
            HeaderAt::File(file) => write_header(path, file, header),
            HeaderAt::Map(map) => map
                .write_persist(0, &header.encode(), topology::CachePolicy::WriteBack)
                .map_err(|source| RegionFileError::Map {
                    path: path.to_path_buf(),
                    source,
                }),
        }
    }
}

/// What opening a region may do to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Keep an existing region's data; create a region only if it is absent
    /// and the manifest does not list it (a region this data directory
    /// never held).
    Keep,
    /// As [`OpenMode::Keep`], but an absent region is created empty even
    /// when the manifest lists it (`--create-missing`).
    CreateMissing,
    /// Recreate the region empty, whatever it holds (`--format`).
    Format,
}

impl OpenMode {
    /// [`OpenMode::Format`] when `format` is set, [`OpenMode::Keep`] otherwise.
    pub fn formatting(format: bool) -> Self {
        if format { Self::Format } else { Self::Keep }
    }

    /// Whether an absent region the manifest lists may be created.
    fn creates_listed(self) -> bool {
        self != Self::Keep
    }
}

impl RegionFile {
    /// Opens the region of `entry`, creating it on first start (or when
    /// `format` is set), checking its header against the topology otherwise,
    /// and maps it with `policy`, as a file in `data_dir` (whatever device
    /// the topology gives it; [`open_on`](Self::open_on) follows devices).
    pub fn open(
        data_dir: &Path,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
        format: bool,
    ) -> Result<Self, RegionFileError> {
        Self::open_on(&ServerDevices::in_data_dir(data_dir), entry, policy, format)
    }

    /// [`open`](Self::open) with the server's device plan given.
    pub fn open_on(
        plan: &ServerDevices,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
        format: bool,
    ) -> Result<Self, RegionFileError> {
        Self::open_with(plan, entry, policy, OpenMode::formatting(format))
    }

    /// [`open_on`](Self::open_on) with what it may do to the region given
    /// by `mode`.
    pub fn open_with(
        plan: &ServerDevices,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
        mode: OpenMode,
    ) -> Result<Self, RegionFileError> {
        let manifest = Manifest::read(&plan.data_dir)?;
        match plan.medium(&entry.socket, &entry.device) {
            Medium::DataDir(dir) | Medium::Directory(dir) => {
                Self::open_file(&dir, manifest, entry, policy, mode)
            }
            Medium::DevDax(dax) => Self::open_devdax(&dax, manifest, entry, policy, mode),
        }
    }

    /// Where the region of `entry` would be, if it is absent: its file does
    /// not exist, or its device DAX slot holds a blank header. `None` when
    /// the region is there (whether or not its header is valid). Changes
    /// nothing.
    pub fn absent_at(
        plan: &ServerDevices,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
    ) -> Result<Option<PathBuf>, RegionFileError> {
        match plan.medium(&entry.socket, &entry.device) {
            Medium::DataDir(dir) | Medium::Directory(dir) => {
                let path = region_path(&dir, entry.region_id.as_str())?;
                let exists = path.try_exists().map_err(|source| RegionFileError::Io {
                    path: path.clone(),
                    op: "check for",
                    source,
                })?;
                Ok((!exists).then_some(path))
            }
            Medium::DevDax(dax) => {
                let (map, label) = map_slot(&dax, entry, policy)?;
                let raw = HeaderAt::Map(&map).read(&label)?;
                Ok(raw.iter().all(|&b| b == 0).then_some(label))
            }
        }
    }

    /// Opens the region file of `entry` in `dir`.
    fn open_file(
        dir: &Path,
        manifest: Manifest,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
        mode: OpenMode,
    ) -> Result<Self, RegionFileError> {
        let format = mode == OpenMode::Format;
        let path = region_path(dir, entry.region_id.as_str())?;
        let exists = path
            .try_exists()
            .map_err(|e| RegionFileError::io(&path)("check for", e))?;
        if !exists && !mode.creates_listed() && manifest.lists(entry.region_id.as_str()) {
            return Err(RegionFileError::Missing {
                path,
                manifest: manifest.path,
            });
        }
        let (header, created) = if exists && !format {
            (Self::reopen(&path, entry)?, false)
        } else {
            (Self::create(&path, entry)?, true)
        };
        manifest.add(entry.region_id.as_str())?;
        let map = PmemMap::open(&path, policy).map_err(|source| RegionFileError::Map {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            path,
            sums: BlockSums::new(header.size),
            header,
            created,
            map,
            place: Place::File,
        })
    }

    /// Maps the slot of `entry` in device DAX device `dax` and creates or
    /// checks its header through the mapping.
    fn open_devdax(
        dax: &DevDax,
        manifest: Manifest,
        entry: &LayoutEntry,
        policy: &PersistPolicy,
        mode: OpenMode,
    ) -> Result<Self, RegionFileError> {
        let format = mode == OpenMode::Format;
        let (map, label) = map_slot(dax, entry, policy)?;
        let at = HeaderAt::Map(&map);
        let raw = at.read(&label)?;
        let blank = raw.iter().all(|&b| b == 0);
        if blank && !mode.creates_listed() && manifest.lists(entry.region_id.as_str()) {
            return Err(RegionFileError::Blank {
                path: label,
                manifest: manifest.path,
            });
        }
        let (header, created) = if blank || format {
            zero_data(&map, &label, entry.len)?;
            let header = fresh_header(&label, entry)?;
            at.write(&label, &header)?;
            (header, true)
        } else {
            let header = reopened_header(&label, &raw, entry)?;
            at.write(&label, &header)?;
            (header, false)
        };
        manifest.add(entry.region_id.as_str())?;
        Ok(Self {
            path: dax.path.clone(),
            sums: BlockSums::new(header.size),
            header,
            created,
            map,
            place: Place::Mapped { label },
        })
    }

    /// Creates (or truncates) the file, sizes it and writes a fresh header.
    fn create(path: &Path, entry: &LayoutEntry) -> Result<RegionHeader, RegionFileError> {
        let io_err = RegionFileError::io(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io_err("create", e))?;
        file.set_len(HEADER_LEN + entry.len)
            .map_err(|e| io_err("size", e))?;
        allocate(path, &file, HEADER_LEN + entry.len)?;
        let header = fresh_header(path, entry)?;
        write_header(path, &file, &header)?;
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("sync the directory of", e))?;
        }
        Ok(header)
    }

    /// Reads and checks an existing header, then records this open in it.
    fn reopen(path: &Path, entry: &LayoutEntry) -> Result<RegionHeader, RegionFileError> {
        let io_err = RegionFileError::io(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err("open", e))?;
        let len = file.metadata().map_err(|e| io_err("stat", e))?.len();
        if len < ENCODED_LEN as u64 {
            return Err(RegionFileError::NotARegionFile {
                path: path.to_path_buf(),
            });
        }
        let raw = HeaderAt::File(&file).read(path)?;
        let expected = HEADER_LEN + entry.len;
        let header = reopened_header(path, &raw, entry)?;
        if len < expected {
            return Err(RegionFileError::Truncated {
                path: path.to_path_buf(),
                len,
                expected,
            });
        }
        // Files made sparse (by an older server, or copied) get their blocks now.
        allocate(path, &file, expected)?;
        write_header(path, &file, &header)?;
        Ok(header)
    }

    /// Bytes of region data.
    pub fn data_len(&self) -> u64 {
        self.header.size
    }

    /// Replaces the region key in the file's header with a fresh random one
    /// and makes it durable before returning it. Callers serialise rotations
    /// of one file; [`RegionFile::header`] keeps the key of this open.
    pub fn rotate_key(&self) -> Result<AccessKey, RegionFileError> {
        let (path, file) = match &self.place {
            Place::File => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&self.path)
                    .map_err(|source| RegionFileError::Io {
                        path: self.path.clone(),
                        op: "open",
                        source,
                    })?;
                (&self.path, Some(file))
            }
            Place::Mapped { label } => (label, None),
        };
        let at = match &file {
            Some(file) => HeaderAt::File(file),
            None => HeaderAt::Map(&self.map),
        };
        let mut header = RegionHeader::decode(path, &at.read(path)?)?;
        header.key = fresh_key(path)?;
        at.write(path, &header)?;
        Ok(header.key)
    }
}

/// Maps the slot of `entry` in device DAX device `dax`; returns the mapping
/// and the label naming the device and the slot's offset in messages.
fn map_slot(
    dax: &DevDax,
    entry: &LayoutEntry,
    policy: &PersistPolicy,
) -> Result<(PmemMap, PathBuf), RegionFileError> {
    let slot = dax
        .slots
        .iter()
        .find(|s| s.region == entry.region_id)
        .ok_or_else(|| RegionFileError::NoSlot {
            path: dax.path.clone(),
            region: entry.region_id.to_string(),
        })?;
    let label = PathBuf::from(format!("{}@{:#x}", dax.path.display(), slot.offset));
    let too_large = || RegionFileError::Map {
        path: label.clone(),
        source: PersistError::Map {
            path: dax.path.clone(),
            source: io::Error::new(
                io::ErrorKind::FileTooLarge,
                "the region does not fit the address space",
            ),
        },
    };
    let len = HEADER_LEN
        .checked_add(entry.len)
        .and_then(|l| usize::try_from(l).ok())
        .ok_or_else(too_large)?;
    let map_len = usize::try_from(slot.map_len).map_err(|_| too_large())?;
    let map = PmemMap::open_device_dax(&dax.path, slot.offset, map_len, len, policy).map_err(
        |source| RegionFileError::Map {
            path: label.clone(),
            source,
        },
    )?;
    Ok((map, label))
}

/// The header of a region `entry` created now: generation 1, a fresh key.
fn fresh_header(path: &Path, entry: &LayoutEntry) -> Result<RegionHeader, RegionFileError> {
    Ok(RegionHeader {
        region_id: entry.region_id.to_string(),
        region_index: entry.region.0,
        size: entry.len,
        generation: 1,
        key: fresh_key(path)?,
    })
}

/// Decodes the header `raw` of an existing region, checks it names
/// `entry`'s region and size, and returns it as this open records it: the
/// generation bumped, a key made if it had none, the current index.
fn reopened_header(
    path: &Path,
    raw: &[u8; ENCODED_LEN],
    entry: &LayoutEntry,
) -> Result<RegionHeader, RegionFileError> {
    let mut header = RegionHeader::decode(path, raw)?;
    let mismatch = |field, in_file: String, in_topology: String| RegionFileError::Mismatch {
        path: path.to_path_buf(),
        field,
        in_file,
        in_topology,
    };
    if header.region_id != entry.region_id.as_str() {
        return Err(mismatch(
            "region id",
            format!("{:?}", header.region_id),
            format!("{:?}", entry.region_id.as_str()),
        ));
    }
    if header.size != entry.len {
        return Err(mismatch(
            "size",
            header.size.to_string(),
            entry.len.to_string(),
        ));
    }
    header.generation += 1;
    if header.key.is_none() {
        header.key = fresh_key(path)?;
    }
    header.region_index = entry.region.0;
    Ok(header)
}

/// Zeroes `len` bytes of region data after the header of `map` with
/// streaming stores (durable on return in DAX mode), a chunk at a time.
fn zero_data(map: &PmemMap, path: &Path, len: u64) -> Result<(), RegionFileError> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK);
        let at = usize::try_from(HEADER_LEN + done).unwrap_or(usize::MAX);
        map.write_persist(at, &zeros[..n as usize], topology::CachePolicy::NonTemporal)
            .map_err(|source| RegionFileError::Map {
                path: path.to_path_buf(),
                source,
            })?;
        done += n;
    }
    Ok(())
}

/// A random, non-zero region key.
fn fresh_key(path: &Path) -> Result<AccessKey, RegionFileError> {
    loop {
        let key = getrandom::u64().map_err(|e| RegionFileError::Io {
            path: path.to_path_buf(),
            op: "draw a random key for",
            source: io::Error::other(e),
        })?;
        if key != 0 {
            return Ok(AccessKey(key));
        }
    }
}

/// Writes `header` at the start of `file` and makes it durable.
fn write_header(path: &Path, file: &File, header: &RegionHeader) -> Result<(), RegionFileError> {
    let io_err = RegionFileError::io(path);
    file.write_all_at(&header.encode(), 0)
        .map_err(|e| io_err("write the header of", e))?;
    file.sync_all().map_err(|e| io_err("sync", e))
}

/// Gives `file` real blocks for its first `len` bytes; a filesystem without
/// room is a [`RegionFileError::NoSpace`] naming the shortfall.
fn allocate(path: &Path, file: &File, len: u64) -> Result<(), RegionFileError> {
    use std::os::fd::AsRawFd;
    let Ok(size) = libc::off_t::try_from(len) else {
        return Err(no_space(path, file, len));
    };
    // SAFETY: posix_fallocate works on a descriptor we own; it returns an
    // error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => Err(no_space(path, file, len)),
        errno => Err(RegionFileError::Io {
            path: path.to_path_buf(),
            op: "allocate the blocks of",
            source: io::Error::from_raw_os_error(errno),
        }),
    }
}

fn no_space(path: &Path, file: &File, needed: u64) -> RegionFileError {
    use std::os::fd::AsRawFd;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs fills the struct for a descriptor we own; it is read
    // only when the call succeeds.
    let available = if unsafe { libc::fstatvfs(file.as_raw_fd(), stat.as_mut_ptr()) } == 0 {
        // SAFETY: initialised by the successful call above.
        let stat = unsafe { stat.assume_init() };
        stat.f_bavail.saturating_mul(stat.f_frsize)
    } else {
        0
    };
    RegionFileError::NoSpace {
        path: path.to_path_buf(),
        needed,
        available,
    }
}

/// The regions a data directory has held, one id per line.
#[derive(Debug)]
pub(crate) struct Manifest {
    /// The manifest file.
    pub(crate) path: PathBuf,
    ids: Vec<String>,
}

/// The manifest's file name in the data directory.
pub const MANIFEST: &str = "regions.manifest";

impl Manifest {
    /// The manifest of `data_dir`; empty when it has none.
    pub(crate) fn read(data_dir: &Path) -> Result<Manifest, RegionFileError> {
        let path = data_dir.join(MANIFEST);
        let ids = match std::fs::read_to_string(&path) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(source) => {
                return Err(RegionFileError::Io {
                    path,
                    op: "read",
                    source,
                });
            }
        };
        Ok(Manifest { path, ids })
    }

    /// Whether the manifest lists no region (or does not exist).
    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether the data directory has held region `id`.
    pub(crate) fn lists(&self, id: &str) -> bool {
        self.ids.iter().any(|i| i == id)
    }

    /// Adds `id`, replacing the file atomically and durably.
    fn add(mut self, id: &str) -> Result<(), RegionFileError> {
        if self.lists(id) {
            return Ok(());
        }
        self.ids.push(id.to_owned());
        let io_err = RegionFileError::io(&self.path);
        let tmp = self.path.with_extension("manifest.tmp");
        let mut text = self.ids.join("\n");
        text.push('\n');
        let file = File::create(&tmp).map_err(|e| io_err("create", e))?;
        file.write_all_at(text.as_bytes(), 0)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_err("write", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io_err("replace", e))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("sync the directory of", e))?;
        }
        Ok(())
    }
}
