//! Bringing an RC queue pair from RESET through INIT and RTR to RTS against
//! a peer's end, as both the client (toward a fabric device) and the PMEM
//! server (toward a fabric device's requester) do.

use proto::qp::Endpoint;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::AddressHandleAttribute;
use sideway::ibverbs::queue_pair::{QueuePair, QueuePairAttribute, QueuePairState};

use crate::device::{self, PortInfo};
use crate::error::RnicError;

/// The attributes of one RC connection.
#[derive(Debug, Clone, Copy)]
pub struct RcAttrs {
    /// The RNIC port (rxe has only port 1).
    pub port: u8,
    /// What the peer may do to this end's memory (`LocalWrite` alone for a
    /// pure requester).
    pub access: AccessFlags,
    /// The path MTU.
    pub path_mtu: sideway::ibverbs::device_context::Mtu,
    /// Incoming READs and atomics this end answers at once.
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub ack_timeout: u8,
    /// Retransmissions before RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = without bound).
    pub rnr_retry: u8,
}

/// Moves `qp` to RTS: INIT with `attrs.access`, RTR toward `remote` (its
/// QPN, first PSN and RoCE v2 GID `::ffff:<remote.ip>`), RTS sending from
/// `local_psn`.
pub fn connect<Q: QueuePair>(
    qp: &mut Q,
    port: &PortInfo,
    attrs: &RcAttrs,
    local_psn: u32,
    remote: &Endpoint,
) -> Result<(), RnicError> {
    let modify = |qp: &mut Q, attr: &QueuePairAttribute, state| {
        qp.modify(attr)
            .map_err(|source| RnicError::ModifyQp { state, source })
    };
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(attrs.port)
        .setup_access_flags(attrs.access);
    modify(qp, &attr, "INIT")?;

    let mut path = AddressHandleAttribute::new();
    path.setup_port(attrs.port)
        .setup_grh(&device::ipv4_gid(remote.ip), 0, port.gid_index, 64, 0);
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(attrs.path_mtu)
        .setup_dest_qp_num(remote.qpn)
        .setup_rq_psn(remote.psn)
        .setup_max_dest_read_atomic(attrs.max_dest_rd_atomic)
        .setup_min_rnr_timer(12)
        .setup_address_vector(&path);
    modify(qp, &attr, "RTR")?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(local_psn)
        .setup_timeout(attrs.ack_timeout)
        .setup_retry_cnt(attrs.retry_cnt)
        .setup_rnr_retry(attrs.rnr_retry)
        .setup_max_read_atomic(port.max_rd_atomic);
    modify(qp, &attr, "RTS")
}

/// The path MTU both ends can use: the smaller of the peer's offer and the
/// local port's active MTU.
pub fn path_mtu(
    offered: u16,
    port: &PortInfo,
) -> Result<sideway::ibverbs::device_context::Mtu, RnicError> {
    Ok(device::mtu_from_bytes(offered)
        .ok_or(RnicError::BadMtu(offered))?
        .min(port.active_mtu))
}

/// A random 24-bit PSN.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (hasher.finish() & 0xFF_FFFF) as u32
}
