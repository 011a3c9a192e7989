//! Shared pieces of the fuzz targets (`fuzz_targets/`).
//!
//! - [`frames`]: byte streams built from structured input and the
//!   invariants every frame must keep.
//! - [`scratch`]: a pmem-server executor over scratch region files.
//! - [`handshake`]: the opening played between a connector and that
//!   executor.

pub mod frames;
pub mod handshake;
pub mod scratch;
