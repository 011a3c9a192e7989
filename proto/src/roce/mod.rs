//! RoCEv2: InfiniBand's Reliable Connection transport over IPv4/UDP.
//!
//! Zero-copy views and owned representations of every header an RC queue
//! pair exchanges, in the style of the rest of this crate:
//!
//! | module | header | bytes |
//! |---|---|---|
//! | [`bth`] | base transport header | 12 |
//! | [`reth`] | RDMA extended header (READ, WRITE, FLUSH, ATOMIC_WRITE target) | 16 |
//! | [`atomic_eth`] | atomic extended header (COMPARE_SWAP, FETCH_ADD) | 28 |
//! | [`aeth`] | ACK extended header (ACK, NAK, RNR NAK; MSN) | 4 |
//! | [`atomic_ack_eth`] | atomic acknowledge (original value) | 8 |
//! | [`feth`] | FLUSH extended header (IBTA 1.5) | 4 |
//! | [`immdt`] | immediate data, and the invalidate header IETH | 4 |
//! | [`packet`] | BTH + the opcode's headers + payload + pad + ICRC | |
//! | [`datagram`] | IPv4 + UDP (port 4791) + packet, with the [`icrc`] | |
//!
//! [`rc`] is the Reliable Connection transport on top: a sans-IO queue pair.
//!
//! Unlike the rest of this crate, RoCE fields are big-endian (network order);
//! the ICRC alone goes on the wire least significant byte first.
//!
//! # Contract
//!
//! Untrusted bytes enter only through `new_checked` ([`datagram::Datagram`]
//! for a whole datagram, [`packet::Packet`] for a UDP payload). Once it
//! succeeds no accessor panics. No function here panics on any input.

mod error;
mod header;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod datagram;
pub mod feth;
pub mod icrc;
pub mod immdt;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod rc;
pub mod reth;

pub use datagram::{Datagram, UDP_PORT};
pub use error::{Error, Result};
pub use opcode::Opcode;
pub use psn::Psn;
