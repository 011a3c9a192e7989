//! [`PmemMap`]: one mapped region file and the operations the executor runs
//! on it.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use memmap2::{MmapMut, MmapOptions};
use topology::CachePolicy;

use super::cacheline::{CacheLineFlusher, CpuFlushSupport, store_fence};
use super::dax::{self, RawMapping};
use super::emulated::{EmulatedMapping, PowerDomain};
#[cfg(feature = "libpmem")]
use super::libpmem::LibpmemMapping;
use super::nt::{self, CachedEdges};
use super::{PersistError, PersistMode, PersistPolicy};

/// One region file mapped read-write and shared, with the means to make
/// stores to it durable.
///
/// `Send + Sync`: share it (e.g. in an `Arc`) between connection threads; see
/// the [module documentation](super) for the concurrency contract.
pub struct PmemMap {
    path: PathBuf,
    /// Start of the mapping, `len` bytes; page-aligned. Copied out of
    /// `backing` so that accesses need no match.
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Who owns the mapping, and so how it is made durable and released.
enum Backing {
    /// `MAP_SYNC` mapping of a file on a DAX filesystem, or (`device`) a
    /// mapping of a device DAX character device, flushed with `flusher`;
    /// munmap on drop (the mapping is held only for that).
    Dax {
        _mapping: RawMapping,
        flusher: CacheLineFlusher,
        device: bool,
    },
    /// memmap2 mapping, flushed with msync; unmapped by memmap2.
    Msync(MmapMut),
    /// libpmem mapping; pmem_unmap on drop.
    #[cfg(feature = "libpmem")]
    Libpmem(LibpmemMapping),
    /// Private mapping in an emulated persistence domain; persisted by
    /// writing lines to the file.
    Emulated(EmulatedMapping),
}

// SAFETY: the mapping is process-wide memory, and every owner in `Backing` is
// itself Send; `base` only caches the owner's address.
unsafe impl Send for PmemMap {}
// SAFETY: `&self` methods access the mapping only through raw pointers after
// bounds checks (never through `&`/`&mut` slices), atomically through
// AtomicU64, or through flush calls that are safe to run concurrently; byte
// races between callers are covered by the module's concurrency contract.
unsafe impl Sync for PmemMap {}

impl fmt::Debug for PmemMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmemMap")
            .field("path", &self.path)
            .field("mode", &self.mode())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PmemMap {
    /// Maps the whole of an existing, already sized file read-write and
    /// shared.
    ///
    /// - [`PersistPolicy::Auto`]: `MAP_SHARED_VALIDATE | MAP_SYNC` (DAX) when
    ///   the file and CPU allow it, else an ordinary mapping flushed with
    ///   msync. Only `EOPNOTSUPP`/`EINVAL` (no DAX) fall back; other mmap
    ///   errors are returned.
    /// - [`PersistPolicy::Dax`]: DAX or [`PersistError::DaxUnsupported`].
    /// - [`PersistPolicy::Msync`]: the ordinary mapping.
    /// - [`PersistPolicy::Libpmem`]: `pmem_map_file`; without the `libpmem`
    ///   feature, [`PersistError::LibpmemDisabled`].
    /// - [`PersistPolicy::Emulated`]: a private mapping in the given power
    ///   domain, for power-loss tests (see `emulated`).
    ///
    /// The file must not be truncated while mapped (accesses beyond its new
    /// end would fault).
    pub fn open(path: &Path, policy: &PersistPolicy) -> Result<PmemMap, PersistError> {
        match policy {
            PersistPolicy::Auto => {
                let (file, len) = open_sized(path)?;
                match map_dax(path, &file, len) {
                    Ok(map) => Ok(map),
                    Err(PersistError::DaxUnsupported { .. }) => map_msync(path, &file, len),
                    Err(err) => Err(err),
                }
            }
            PersistPolicy::Dax => {
                let (file, len) = open_sized(path)?;
                map_dax(path, &file, len)
            }
            PersistPolicy::Msync => {
                let (file, len) = open_sized(path)?;
                map_msync(path, &file, len)
            }
            PersistPolicy::Libpmem => map_libpmem(path),
            PersistPolicy::Emulated(domain) => {
                let (file, len) = open_sized(path)?;
                map_emulated(path, file, len, domain)
            }
        }
    }

    /// Maps `len` bytes of the device DAX character device `path` from
    /// `offset`, read-write and shared; `map_len` (at least `len`) bytes are
    /// mapped so that `offset` and `map_len` can be multiples of the
    /// device's alignment, and only the first `len` are served. Stores are
    /// made durable by cache-line write-back (device DAX is always
    /// synchronous: no `MAP_SYNC`, no msync). Only the `auto` and `dax`
    /// policies apply; others are [`PersistError::DevDaxPolicy`].
    pub fn open_device_dax(
        path: &Path,
        offset: u64,
        map_len: usize,
        len: usize,
        policy: &PersistPolicy,
    ) -> Result<PmemMap, PersistError> {
        if !matches!(policy, PersistPolicy::Auto | PersistPolicy::Dax) {
            return Err(PersistError::DevDaxPolicy {
                path: path.to_owned(),
                policy: policy.name(),
            });
        }
        let map_err = |source| PersistError::Map {
            path: path.to_owned(),
            source,
        };
        if len == 0 || len > map_len {
            return Err(map_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot serve {len} bytes of a {map_len}-byte mapping"),
            )));
        }
        let flusher = CpuFlushSupport::get()
            .best()
            .ok_or_else(|| dax_unsupported(path, no_flush_instruction()))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(map_err)?;
        let mapping = RawMapping::map_device(&file, offset, map_len).map_err(map_err)?;
        Ok(PmemMap {
            path: path.to_owned(),
            base: mapping.base(),
            len,
            backing: Backing::Dax {
                _mapping: mapping,
                flusher,
                device: true,
            },
        })
    }

    /// Start of the mapping, for registering it with an RNIC: the mapping
    /// is [`len`](Self::len) bytes from here and lives as long as `self`
    /// (a region's data starts [`HEADER_LEN`](crate::region_format::HEADER_LEN)
    /// bytes in). Accesses through it are bound by the module's concurrency
    /// contract, and writes through it bypass this type's persistence:
    /// whoever writes there makes the bytes durable itself.
    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The persistence mechanism in use.
    pub fn mode(&self) -> PersistMode {
        match self.backing {
            Backing::Dax { device: false, .. } => PersistMode::Dax,
            Backing::Dax { device: true, .. } => PersistMode::DevDax,
            Backing::Msync(_) => PersistMode::Msync,
            #[cfg(feature = "libpmem")]
            Backing::Libpmem(_) => PersistMode::Libpmem,
            Backing::Emulated(_) => PersistMode::Emulated,
        }
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the mapping (the file's size) in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has no bytes; never true, as empty files are
    /// refused by [`open`](Self::open).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `mapping[offset..offset + dst.len()]` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), PersistError> {
        let src = self.range_ptr(offset, dst.len())?;
        // SAFETY: range_ptr checked that dst.len() bytes at `src` lie inside
        // the live mapping; `dst` is an exclusive caller buffer, never part of
        // the mapping (no slice of it is ever handed out), so they do not
        // overlap. Concurrent writers may tear the bytes (module contract).
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Stores `src` at `offset`.
    ///
    /// [`CachePolicy::WriteBack`] is an ordinary copy. [`CachePolicy::NonTemporal`]
    /// streams the aligned middle with non-temporal stores, copies the
    /// unaligned edges normally (writing their cache lines back in DAX mode),
    /// and ends with SFENCE. Either way the bytes are durable only after
    /// [`persist`](Self::persist) — except NonTemporal in DAX mode, which is
    /// durable on return.
    pub fn write(&self, offset: usize, src: &[u8], cache: CachePolicy) -> Result<(), PersistError> {
        let dst = self.range_ptr(offset, src.len())?;
        // SAFETY: range_ptr checked the destination range.
        unsafe { self.store(dst, src, cache) };
        Ok(())
    }

    /// Makes `[offset, offset + len)` durable.
    ///
    /// DAX: writes back every cache line of the range, then SFENCE. Msync:
    /// msync(`MS_SYNC`) of the pages covering the range. Libpmem:
    /// `pmem_persist` when the mapping is persistent memory, else
    /// `pmem_msync`.
    pub fn persist(&self, offset: usize, len: usize) -> Result<(), PersistError> {
        let start = self.range_ptr(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let result = match &self.backing {
            Backing::Dax { flusher, .. } => {
                // SAFETY: range_ptr checked the range is inside the mapping.
                unsafe { flusher.write_back(start, len) };
                store_fence();
                Ok(())
            }
            Backing::Msync(mmap) => mmap.flush_range(offset, len),
            #[cfg(feature = "libpmem")]
            // SAFETY: range_ptr checked the range is inside the mapping.
            Backing::Libpmem(mapping) => unsafe { mapping.persist(offset, len) },
            Backing::Emulated(mapping) => mapping.persist(offset, len),
        };
        result.map_err(|source| self.flush_error(offset, len, source))
    }

    /// [`write`](Self::write) and [`persist`](Self::persist) in one step,
    /// skipping work the store already did: a NonTemporal write in DAX mode
    /// is durable as is; libpmem on persistent memory uses
    /// `pmem_memcpy_persist` (for either cache policy: libpmem picks the
    /// stores itself).
    pub fn write_persist(
        &self,
        offset: usize,
        src: &[u8],
        cache: CachePolicy,
    ) -> Result<(), PersistError> {
        let dst = self.range_ptr(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        match (&self.backing, cache) {
            (Backing::Dax { .. }, CachePolicy::NonTemporal) => {
                // SAFETY: range_ptr checked the destination range.
                unsafe { self.store(dst, src, cache) };
                Ok(())
            }
            #[cfg(feature = "libpmem")]
            (Backing::Libpmem(mapping), _) if mapping.is_pmem() => {
                // SAFETY: range_ptr checked the range; is_pmem holds.
                unsafe { mapping.memcpy_persist(offset, src) };
                Ok(())
            }
            _ => {
                // SAFETY: range_ptr checked the destination range.
                unsafe { self.store(dst, src, cache) };
                self.persist(offset, src.len())
            }
        }
    }

    /// The 8-byte word at `offset` as an atomic, for COMPARE_SWAP, FETCH_ADD
    /// and ATOMIC_WRITE. `offset` must be a multiple of 8 and the word inside
    /// the mapping. Persist the word afterwards to make the result durable.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, PersistError> {
        if !offset.is_multiple_of(8) {
            return Err(PersistError::Misaligned { offset });
        }
        let word = self.range_ptr(offset, 8)?;
        if !word.addr().is_multiple_of(align_of::<AtomicU64>()) {
            // The mapping is page-aligned, so this cannot happen; checked
            // anyway because the cast below relies on it.
            return Err(PersistError::Misaligned { offset });
        }
        if let Backing::Emulated(mapping) = &self.backing {
            mapping.mark_written(offset, 8);
        }
        // SAFETY: the 8 bytes at `word` are inside the mapping, which lives as
        // long as the returned borrow of `self`, and the address is aligned
        // for AtomicU64 (checked). AtomicU64 has interior mutability, so many
        // shared references to the same word, from any thread, are fine; plain
        // writes of the same bytes by other requests are the application-level
        // race the module's concurrency contract describes.
        Ok(unsafe { &*word.cast::<AtomicU64>() })
    }

    /// Makes the whole mapping durable (at shutdown).
    pub fn persist_all(&self) -> Result<(), PersistError> {
        self.persist(0, self.len)
    }

    /// Address of `offset` after checking that `[offset, offset + len)` lies
    /// inside the mapping, without overflow.
    fn range_ptr(&self, offset: usize, len: usize) -> Result<*mut u8, PersistError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: offset <= end <= self.len, so the result is inside
                // the mapping or one past its end.
                Ok(unsafe { self.base.as_ptr().add(offset) })
            }
            _ => Err(PersistError::OutOfBounds {
                offset,
                len,
                map_len: self.len,
            }),
        }
    }

    /// Copies `src` to `dst` with the stores `cache` asks for.
    ///
    /// # Safety
    ///
    /// `dst` must come from [`range_ptr`](Self::range_ptr) for `src.len()`.
    unsafe fn store(&self, dst: *mut u8, src: &[u8], cache: CachePolicy) {
        if let Backing::Emulated(mapping) = &self.backing {
            mapping.mark_written(dst.addr() - self.base.as_ptr().addr(), src.len());
        }
        match cache {
            CachePolicy::WriteBack => {
                // SAFETY: the destination range is inside the mapping (caller);
                // `src` is a caller buffer, never part of the mapping.
                unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
            }
            CachePolicy::NonTemporal => {
                // SAFETY: as above.
                let edges = unsafe { nt::copy_streaming(dst, src) };
                if let Backing::Dax { flusher, .. } = &self.backing {
                    // SAFETY: the edges are sub-ranges of the destination.
                    unsafe { write_back_edges(*flusher, dst, &edges) };
                }
                store_fence();
            }
        }
    }

    fn flush_error(&self, offset: usize, len: usize, source: io::Error) -> PersistError {
        PersistError::Flush {
            path: self.path.clone(),
            offset,
            len,
            source,
        }
    }

    /// What `pmem_is_pmem` said about a libpmem mapping.
    #[cfg(all(test, feature = "libpmem"))]
    pub(crate) fn libpmem_is_pmem(&self) -> Option<bool> {
        match &self.backing {
            Backing::Libpmem(mapping) => Some(mapping.is_pmem()),
            _ => None,
        }
    }

    /// A DAX-mode map over a plain `MAP_SHARED` mapping, so tests can run the
    /// DAX code paths (cache-line write-back, NonTemporal edges) anywhere.
    /// Not durable by itself where the file is not on DAX.
    #[cfg(test)]
    pub(crate) fn open_dax_without_map_sync(path: &Path) -> Result<PmemMap, PersistError> {
        let (file, len) = open_sized(path)?;
        let flusher = CpuFlushSupport::get()
            .best()
            .ok_or_else(|| dax_unsupported(path, no_flush_instruction()))?;
        let mapping =
            RawMapping::map_shared_for_test(&file, len).map_err(|source| PersistError::Map {
                path: path.to_owned(),
                source,
            })?;
        Ok(PmemMap {
            path: path.to_owned(),
            base: mapping.base(),
            len: mapping.len(),
            backing: Backing::Dax {
                _mapping: mapping,
                flusher,
                device: false,
            },
        })
    }
}

/// Writes back the cache lines of the normally stored edges of a streamed
/// copy.
///
/// # Safety
///
/// `dst` must be valid for the ranges in `edges`.
unsafe fn write_back_edges(flusher: CacheLineFlusher, dst: *mut u8, edges: &CachedEdges) {
    for edge in [&edges.head, &edges.tail] {
        if !edge.is_empty() {
            // SAFETY: the edge lies inside the caller's destination range.
            unsafe { flusher.write_back(dst.add(edge.start), edge.len()) };
        }
    }
}

/// Opens `path` read-write and returns it with its length, refusing empty
/// files and (on 32-bit targets) files larger than the address space.
fn open_sized(path: &Path) -> Result<(File, usize), PersistError> {
    let map_err = |source| PersistError::Map {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(map_err)?;
    let size = file.metadata().map_err(map_err)?.len();
    let len = usize::try_from(size).map_err(|_| {
        map_err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{size} bytes do not fit the address space"),
        ))
    })?;
    if len == 0 {
        return Err(PersistError::EmptyFile {
            path: path.to_owned(),
        });
    }
    Ok((file, len))
}

fn map_dax(path: &Path, file: &File, len: usize) -> Result<PmemMap, PersistError> {
    let flusher = CpuFlushSupport::get()
        .best()
        .ok_or_else(|| dax_unsupported(path, no_flush_instruction()))?;
    let mapping = RawMapping::map_sync(file, len).map_err(|source| {
        if dax::is_dax_unsupported(&source) {
            dax_unsupported(path, source)
        } else {
            PersistError::Map {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    Ok(PmemMap {
        path: path.to_owned(),
        base: mapping.base(),
        len: mapping.len(),
        backing: Backing::Dax {
            _mapping: mapping,
            flusher,
            device: false,
        },
    })
}

fn map_msync(path: &Path, file: &File, len: usize) -> Result<PmemMap, PersistError> {
    // SAFETY: memmap2 requires that the file is not modified or truncated
    // behind the mapping's back in ways that break Rust references into it.
    // PmemMap never creates references to the mapped bytes (all access is by
    // raw pointer, atomics through AtomicU64), so outside modification is no
    // worse than a concurrent client write; truncation is excluded by open's
    // documented contract.
    let mut mmap = unsafe { MmapOptions::new().len(len).map_mut(file) }.map_err(|source| {
        PersistError::Map {
            path: path.to_owned(),
            source,
        }
    })?;
    let base = NonNull::new(mmap.as_mut_ptr()).ok_or_else(|| PersistError::Map {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, "mapping at address 0"),
    })?;
    Ok(PmemMap {
        path: path.to_owned(),
        base,
        len: mmap.len(),
        backing: Backing::Msync(mmap),
    })
}

fn map_emulated(
    path: &Path,
    file: File,
    len: usize,
    domain: &Arc<PowerDomain>,
) -> Result<PmemMap, PersistError> {
    let mapping = EmulatedMapping::map(path, file, len, domain)?;
    Ok(PmemMap {
        path: path.to_owned(),
        base: mapping.base(),
        len: mapping.len(),
        backing: Backing::Emulated(mapping),
    })
}

#[cfg(feature = "libpmem")]
fn map_libpmem(path: &Path) -> Result<PmemMap, PersistError> {
    // Opened once here only for the same empty/unreadable-file errors as the
    // other modes; libpmem opens the file itself.
    open_sized(path)?;
    let mapping = LibpmemMapping::map(path)?;
    Ok(PmemMap {
        path: path.to_owned(),
        base: mapping.base(),
        len: mapping.len(),
        backing: Backing::Libpmem(mapping),
    })
}

#[cfg(not(feature = "libpmem"))]
fn map_libpmem(_path: &Path) -> Result<PmemMap, PersistError> {
    Err(PersistError::LibpmemDisabled)
}

fn dax_unsupported(path: &Path, source: io::Error) -> PersistError {
    PersistError::DaxUnsupported {
        path: path.to_owned(),
        source,
    }
}

fn no_flush_instruction() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this CPU has no cache-line write-back instruction",
    )
}
