//! The device's RDMA side, on its RoCEv2 ports: the gateway that ends
//! clients' queue pairs, the uplinks that carry requests to servers on
//! verbs, their counters, and how their queue pairs are numbered.
//!
//! - `qp_numbering`: the QP number ranges of the gateway and the uplinks,
//!   and their random starting numbers.
//! - `gateway`: the RoCEv2 gateway, client queue pairs bridged to the core.
//! - `uplink`: RC queue pairs toward servers on verbs, which carry READ,
//!   WRITE, FLUSH and ATOMIC_WRITE to the server's RNIC.
//! - `metrics`: what `/metrics` exports of the RoCE ports and uplinks.

pub(crate) mod gateway;
pub(crate) mod metrics;
pub(crate) mod qp_numbering;
pub(crate) mod uplink;
