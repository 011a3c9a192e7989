//! Shared pieces of the fuzz targets (`fuzz_targets/`): byte streams built
//! from structured input and the invariants every frame must keep
//! ([`frames`]), a pmem-server executor over scratch region files
//! ([`scratch`]), and the opening played between a connector and that
//! executor ([`handshake`]).

pub mod frames;
pub mod handshake;
pub mod scratch;
