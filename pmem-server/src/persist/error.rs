//! Errors of the persistence layer.

use std::io;
use std::path::PathBuf;

/// Why mapping a region file or accessing / persisting a range failed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// `[offset, offset + len)` is not inside the mapping (or its end
    /// overflows).
    #[error("range of {len} bytes at offset {offset} is outside the {map_len}-byte mapping")]
    OutOfBounds {
        /// Start of the requested range.
        offset: usize,
        /// Length of the requested range.
        len: usize,
        /// Length of the mapping.
        map_len: usize,
    },
    /// An atomic access at an offset that is not a multiple of 8.
    #[error("offset {offset} is not 8-byte aligned")]
    Misaligned {
        /// The requested offset.
        offset: usize,
    },
    /// The file has no bytes to map.
    #[error("{} is empty; size a region file before mapping it", path.display())]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// Opening, sizing or mapping the file failed.
    #[error("cannot map {}", path.display())]
    Map {
        /// The file.
        path: PathBuf,
        /// The failing call's error.
        #[source]
        source: io::Error,
    },
    /// DAX was requested but the file cannot be mapped with `MAP_SYNC` (not
    /// on a DAX filesystem, or no cache-line write-back on this CPU).
    #[error("{} cannot be mapped for DAX (MAP_SHARED_VALIDATE | MAP_SYNC)", path.display())]
    DaxUnsupported {
        /// The file.
        path: PathBuf,
        /// The mmap error (errno), or why DAX is not possible here.
        #[source]
        source: io::Error,
    },
    /// Making a range durable failed.
    #[error("cannot make {len} bytes at offset {offset} of {} durable", path.display())]
    Flush {
        /// The mapped file.
        path: PathBuf,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The msync error.
        #[source]
        source: io::Error,
    },
    /// A device DAX region under a policy other than `auto` or `dax`.
    #[error(
        "{} is device DAX, made durable by cache-line write-back only; persistence \
         {policy:?} cannot apply to it (use auto or dax)",
        path.display()
    )]
    DevDaxPolicy {
        /// The device.
        path: PathBuf,
        /// The policy asked for.
        policy: &'static str,
    },
    /// The libpmem policy was requested from a build without the `libpmem`
    /// feature.
    #[error("the libpmem persistence policy needs pmem-server built with feature \"libpmem\"")]
    LibpmemDisabled,
    /// libpmem could not map the file.
    #[error("libpmem cannot map {}: {message}", path.display())]
    Libpmem {
        /// The file.
        path: PathBuf,
        /// libpmem's error text (`pmem_errormsg`).
        message: String,
    },
}
