//! Bringing a `syncing` copy of a replicated region up to date, sans-IO:
//! which runs of blocks to compare next, which blocks to copy, when the
//! copy may serve, and how fast the copies may go.
//!
//! - [`walk`]: the walk over the region's blocks, pass after pass, until a
//!   whole pass finds every block's checksum equal on both copies.
//! - [`rate`]: a token bucket of bytes per second that paces the copies.
//!
//! The owner device asks each copy's server for the current checksums of a
//! run of blocks (BLOCK_SUMS), feeds both answers to the walk, and copies
//! each block the walk names from the deciding copy to the syncing one,
//! once the bucket lets it.

pub(crate) mod rate;
pub(crate) mod walk;
