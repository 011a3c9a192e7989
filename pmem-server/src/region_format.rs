//! The fixed facts of a region file's format, which the file itself, the
//! device placement, the checksums and the executor all need: the magic and
//! version of its header, and how many bytes of header come before the data.

/// The first bytes of every region file.
pub const MAGIC: [u8; 8] = *b"PMFABRGN";
/// The header format version this server writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the region data: one page, so the data is page-aligned.
pub const HEADER_LEN: u64 = 4096;
/// The longest region id a header holds.
pub const MAX_ID_LEN: usize = 256;
