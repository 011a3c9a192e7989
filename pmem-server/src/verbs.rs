//! The server's RDMA side: the regions of a `verbs` NIC's socket registered
//! with its RNIC, and one RC queue pair per fabric device link, set up on
//! that link's control connection with QP_CONNECT.
//!
//! Each region's data is registered at I/O virtual address 0, so a
//! device's READ, WRITE, FLUSH and ATOMIC_WRITE name the region offset
//! directly, with the region's R_Key. R_Keys are handed out only in the
//! QP_ACCEPT answering an authenticated device (with `--secrets`) and
//! change every time the server starts (each start registers anew). A
//! queue pair is bound to the map epoch its connection said: a takeover of
//! a region held here destroys those of older epochs and of the deposed
//! owner before the server runs the new epoch (`qp_fence`). The
//! RNIC executes those operations; this process takes part only in set-up,
//! in what RDMA cannot carry (exactly-once atomics, requests with
//! per-extent keys, which stay on the control connection) and in metrics.
//!
//! **Persistence.** Registration asks for the IBTA 1.5 FLUSH access with
//! the persistence placement type. Where the RNIC grants it (Linux rxe on
//! persistent memory does), a device makes a WRITE durable with a FLUSH on
//! the same queue pair, and the server says `flush` on `/metrics`. Where it
//! does not, the device reads after writing (the appliance persistency
//! method, `apm`): durable only where the RNIC places writes in the
//! persistence domain (ADR, DDIO off), which the operator must know.
//!
//! **Pinning.** A registration pins the pages for as long as it lives.
//! Linux refuses that for fsdax files (`EOPNOTSUPP`) and for writable
//! page-cache files (`EFAULT`); device DAX can be pinned, and an RNIC with
//! on-demand paging needs no pinning. Registration tries pinning, then
//! on-demand paging, and otherwise fails naming the region, what the
//! kernel said and what to do.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use proto::qp::{self, Connect, Endpoint, caps};
use rnic::mr::{EFAULT, EINVAL, EOPNOTSUPP, Registration};
use rnic::rc::RcAttrs;
use rnic::{PortInfo, RnicError};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{BasicQueuePair, QueuePair, QueuePairType, SendOperationFlags};
use topology::{NicId, ServerNic};
use tracing::{info, warn};

use crate::numa::{choose_rdma_device, rdma_device_node, rdma_device_parent};
use crate::region_file::HEADER_LEN;
use crate::served_region::ServedRegion;

/// Where sysfs is.
const SYSFS: &str = "/sys";
/// The RNIC port used (rxe has only port 1).
const PORT: u8 = 1;
/// Incoming READs and atomics a queue pair answers at once.
const MAX_DEST_RD_ATOMIC: u8 = 16;

/// How writes over RDMA are made durable on a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaPersistence {
    /// IBTA 1.5 FLUSH, persistence placement type.
    Flush,
    /// READ after WRITE (appliance persistency method).
    Apm,
}

impl RdmaPersistence {
    /// `flush` or `apm`.
    pub fn as_str(self) -> &'static str {
        match self {
            RdmaPersistence::Flush => "flush",
            RdmaPersistence::Apm => "apm",
        }
    }
}

/// How a region's memory was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    /// Pinned for the registration's life (device DAX, anonymous memory).
    Pinned,
    /// On-demand paging: the RNIC faults pages in.
    OnDemand,
}

/// Why a NIC cannot serve over verbs.
#[derive(Debug, thiserror::Error)]
pub enum VerbsNicError {
    /// The listen address is not IPv4 (validation catches this first).
    #[error("NIC {nic}: listen address {addr:?} is not IPv4, so it cannot be a RoCEv2 address")]
    Address {
        /// The NIC.
        nic: NicId,
        /// Its listen address.
        addr: String,
    },
    /// The RDMA device cannot be opened or used.
    #[error("NIC {nic}: RDMA device")]
    Rnic {
        /// The NIC.
        nic: NicId,
        /// Why.
        #[source]
        source: RnicError,
    },
    /// The kernel will not let the RNIC reach a region's memory.
    #[error("NIC {nic}: region {region} cannot be registered with {device}: {why}; {advice}")]
    Register {
        /// The NIC.
        nic: NicId,
        /// The region.
        region: String,
        /// The RDMA device.
        device: String,
        /// What the kernel said, in words.
        why: &'static str,
        /// What to do about it.
        advice: &'static str,
        /// The last refusal.
        #[source]
        source: RnicError,
    },
    /// The persistence mechanism keeps writes where RDMA cannot see them.
    #[error(
        "NIC {nic}: region {region} is mapped privately (persistence \"emulated\"), where the \
         RNIC's writes would bypass the emulated persistence domain; use dax, msync or libpmem"
    )]
    Emulated {
        /// The NIC.
        nic: NicId,
        /// The region.
        region: String,
    },
}

/// One region as the RNIC sees it.
#[derive(Debug)]
struct RegisteredRegion {
    index: u32,
    registration: Registration,
}

/// A `verbs` NIC: its RDMA device, protection domain, the registrations of
/// its socket's regions, and what its queue pairs offer.
///
/// Fields drop in declaration order: registrations and CQ before the PD,
/// the PD before the device context.
#[derive(Debug)]
pub struct VerbsNic {
    nic: NicId,
    regions: Vec<RegisteredRegion>,
    cq: Arc<BasicCompletionQueue>,
    pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
    device: String,
    port: PortInfo,
    ip: Ipv4Addr,
    persistence: RdmaPersistence,
    atomic_write: bool,
    /// The device is Linux rxe (see `caps::RXE_FLUSH_ICRC`).
    rxe: bool,
}

// SAFETY: the verbs handles inside (context, PD, CQ, MRs) may be used from
// any thread, and queue pairs created from several threads at once; this
// type only reads them after construction.
unsafe impl Send for VerbsNic {}
// SAFETY: as above; `&self` methods create new queue pairs, which libibverbs
// allows concurrently on one PD and CQ.
unsafe impl Sync for VerbsNic {}

impl VerbsNic {
    /// Opens the NIC's RDMA device and registers `regions` (those of the
    /// NIC's socket, whose PMEM is on NUMA node `node`) with it. The device
    /// is the one the topology names, or else the first on `node`, or else
    /// the first; one on another node than `node` is used, with a warning.
    pub fn open(
        spec: &ServerNic,
        regions: &[&ServedRegion],
        node: Option<u32>,
    ) -> Result<VerbsNic, Box<VerbsNicError>> {
        let nic = spec.id.clone();
        let ip = match spec.listen.parse::<SocketAddr>() {
            Ok(SocketAddr::V4(a)) => *a.ip(),
            _ => {
                return Err(Box::new(VerbsNicError::Address {
                    nic,
                    addr: spec.listen.clone(),
                }));
            }
        };
        let rnic_err = |source| {
            Box::new(VerbsNicError::Rnic {
                nic: spec.id.clone(),
                source,
            })
        };
        let sys = Path::new(SYSFS);
        let chosen = match &spec.rdma_device {
            Some(named) => Some(named.clone()),
            None => {
                let present = rnic::device_names().map_err(rnic_err)?;
                choose_rdma_device(&present, node, |d| rdma_device_node(sys, d)).map(str::to_owned)
            }
        };
        let (ctx, device) = rnic::open(chosen.as_deref()).map_err(rnic_err)?;
        say_rdma_device_node(spec, &device, rdma_device_node(sys, &device), node);
        let port = rnic::port_info(&ctx, &device, PORT, ip).map_err(rnic_err)?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| rnic_err(RnicError::AllocPd(e)))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(16)
            .build()
            .map_err(|e| rnic_err(RnicError::CreateCq(e)))?;
        let mut registered = Vec::with_capacity(regions.len());
        let mut flush = true;
        for region in regions {
            let id = region.entry.region_id.to_string();
            if region.file.map.mode() == crate::persist::PersistMode::Emulated {
                return Err(Box::new(VerbsNicError::Emulated { nic, region: id }));
            }
            let (registration, pinning, persistent) =
                register(&pd, region, &device).map_err(|(why, advice, source)| {
                    Box::new(VerbsNicError::Register {
                        nic: nic.clone(),
                        region: id.clone(),
                        device: device.clone(),
                        why,
                        advice,
                        source,
                    })
                })?;
            flush &= persistent;
            info!(
                "region {id}: {} bytes registered with {device} at I/O address 0, R_Key \
                 {:#x}, {}{}",
                registration.len(),
                registration.rkey(),
                match pinning {
                    Pinning::Pinned => "pinned",
                    Pinning::OnDemand => "on-demand paging",
                },
                if persistent {
                    ", FLUSH to persistence"
                } else {
                    ""
                }
            );
            registered.push(RegisteredRegion {
                index: region.entry.region.0,
                registration,
            });
        }
        let persistence = if flush {
            RdmaPersistence::Flush
        } else {
            RdmaPersistence::Apm
        };
        let mut probe = pd.create_qp_builder();
        probe
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(1)
            .setup_max_recv_wr(1)
            .setup_send_cq(Arc::clone(&cq))
            .setup_recv_cq(Arc::clone(&cq))
            .setup_send_ops_flags(SendOperationFlags::Write | SendOperationFlags::AtomicWrite);
        // A provider that builds ATOMIC_WRITE work requests executes them too.
        let atomic_write = probe.build_ex().is_ok();
        info!(
            "NIC {nic}: verbs on {device} ({ip}, GID index {}), {} regions, persistence over \
             RDMA: {}{}",
            port.gid_index,
            registered.len(),
            persistence.as_str(),
            if atomic_write { ", ATOMIC_WRITE" } else { "" }
        );
        let rxe = rdma_device_parent(sys, &device).is_some();
        Ok(VerbsNic {
            nic,
            regions: registered,
            cq,
            pd,
            _ctx: ctx,
            device,
            port,
            ip,
            persistence,
            atomic_write,
            rxe,
        })
    }

    /// The NIC.
    pub fn nic(&self) -> &NicId {
        &self.nic
    }

    /// How RDMA writes are made durable here.
    pub fn persistence(&self) -> RdmaPersistence {
        self.persistence
    }

    /// The RDMA device.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Creates an RC queue pair answering the device end `connect` names
    /// and returns it with the QP_ACCEPT body-to-be: this end, the R_Key
    /// table and the capabilities.
    pub fn accept(
        &self,
        connect: &Connect,
    ) -> Result<(ServerQp, Endpoint, Vec<u8>, u64), RnicError> {
        let mut qp = self
            .pd
            .create_qp_builder()
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(1)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&self.cq))
            .setup_recv_cq(Arc::clone(&self.cq))
            .build()
            .map_err(RnicError::CreateQp)?;
        let remote = connect.endpoint;
        let path_mtu = rnic::rc::path_mtu(remote.mtu, &self.port)?;
        let mut access = AccessFlags::LocalWrite
            | AccessFlags::RemoteWrite
            | AccessFlags::RemoteRead
            | AccessFlags::RemoteAtomic;
        if self.persistence == RdmaPersistence::Flush {
            access = access | AccessFlags::FlushGlobal | AccessFlags::FlushPersistent;
        }
        let attrs = RcAttrs {
            port: PORT,
            access,
            path_mtu,
            max_dest_rd_atomic: MAX_DEST_RD_ATOMIC,
            ack_timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        };
        let psn = rnic::rc::random_psn();
        rnic::rc::connect(&mut qp, &self.port, &attrs, psn, &remote)?;
        let local = Endpoint {
            qpn: qp.qp_number(),
            psn,
            ip: self.ip,
            mtu: rnic::mtu_bytes(path_mtu),
        };
        let table: Vec<(u32, u32)> = self
            .regions
            .iter()
            .map(|r| (r.index, r.registration.rkey()))
            .collect();
        let mut caps = 0;
        if self.persistence == RdmaPersistence::Flush {
            caps |= caps::FLUSH_PERSISTENT;
        }
        if self.atomic_write {
            caps |= caps::ATOMIC_WRITE;
        }
        if self.rxe {
            caps |= caps::RXE_FLUSH_ICRC;
        }
        Ok((ServerQp { _qp: qp }, local, qp::encode_rkeys(&table), caps))
    }
}

/// Logs the NUMA node of a verbs NIC's RDMA device next to its socket's
/// (`pmem_node`), warning when they differ: every RDMA access would cross
/// between the nodes.
fn say_rdma_device_node(
    spec: &ServerNic,
    device: &str,
    rnic_node: Option<u32>,
    pmem_node: Option<u32>,
) {
    let (nic, socket) = (&spec.id, &spec.socket);
    match (rnic_node, pmem_node) {
        (Some(rnic), Some(pmem)) if rnic != pmem => warn!(
            "NIC {nic} of socket {socket}: RDMA device {device} is on NUMA node {rnic}, the \
             socket's PMEM on node {pmem}: every RDMA access crosses between them; name an RNIC \
             of node {pmem} as the NIC's rdma_device"
        ),
        (Some(rnic), _) => {
            info!("NIC {nic} of socket {socket}: RDMA device {device}, NUMA node {rnic}")
        }
        (None, _) => info!("NIC {nic} of socket {socket}: RDMA device {device}, NUMA node unknown"),
    }
}

/// One device's queue pair; destroyed with the control connection that set
/// it up, or when a takeover fences it (`qp_fence`).
#[derive(Debug)]
pub struct ServerQp {
    _qp: BasicQueuePair,
}

// SAFETY: a queue pair handle may be destroyed from any thread; nothing
// else touches it.
unsafe impl Send for ServerQp {}

/// Registers a region's data (after its header) at I/O address 0: pinned
/// with persistent FLUSH, pinned without it, then on-demand paging (with
/// and without). Returns the registration, how, and whether FLUSH to
/// persistence was granted; or why not and what to do.
fn register(
    pd: &Arc<ProtectionDomain>,
    region: &ServedRegion,
    device: &str,
) -> Result<(Registration, Pinning, bool), (&'static str, &'static str, RnicError)> {
    let map = &region.file.map;
    let header = HEADER_LEN as usize;
    let len = map.len().saturating_sub(header);
    // SAFETY: the mapping is `map.len()` bytes from `base_ptr`, so the data
    // after the header lies inside it.
    let addr = unsafe { map.base_ptr().add(header) };
    let remote = AccessFlags::LocalWrite
        | AccessFlags::RemoteWrite
        | AccessFlags::RemoteRead
        | AccessFlags::RemoteAtomic;
    let persistent = remote | AccessFlags::FlushGlobal | AccessFlags::FlushPersistent;
    let what = format!("region {} on {device}", region.entry.region_id);
    let attempts = [
        (persistent, Pinning::Pinned, true),
        (remote, Pinning::Pinned, false),
        (persistent | AccessFlags::OnDemand, Pinning::OnDemand, true),
        (remote | AccessFlags::OnDemand, Pinning::OnDemand, false),
    ];
    let mut last = None;
    let mut pin_refused = None;
    for (access, pinning, flush) in attempts {
        // SAFETY: the mapping outlives the registration: `VerbsNic` (which
        // holds it) is dropped before the executor's regions (see
        // `server`), and remote writes are what the region is for.
        match unsafe { Registration::new(pd, addr, len, 0, access, &what) } {
            Ok(r) => return Ok((r, pinning, flush)),
            Err(e) => {
                if let RnicError::RegMr { source, .. } = &e
                    && pinning == Pinning::Pinned
                    && matches!(source.raw_os_error(), Some(EOPNOTSUPP | EFAULT))
                {
                    pin_refused = source.raw_os_error();
                }
                last = Some(e);
            }
        }
    }
    let source = last.unwrap_or(RnicError::NoDevice);
    Err(match pin_refused {
        Some(EOPNOTSUPP) => (
            "the kernel refuses long-term pinning of its pages (an fsdax file) and the RNIC \
             has no on-demand paging",
            "put the region on device DAX (ndctl create-namespace -m devdax; the PMEM device's \
             path = \"/dev/daxX.Y\"), or serve this NIC with transport = \"tcp\"",
            source,
        ),
        Some(_) => (
            "the kernel refuses long-term pinning of writable page-cache pages and the RNIC \
             has no on-demand paging",
            "put the region on device DAX (ndctl create-namespace -m devdax; the PMEM device's \
             path = \"/dev/daxX.Y\"), or serve this NIC with transport = \"tcp\"",
            source,
        ),
        None if matches!(&source, RnicError::RegMr { source, .. } if source.raw_os_error() == Some(EINVAL)) => {
            (
                "the device refused the registration (EINVAL)",
                "check the region is mapped and the RDMA device supports remote atomics",
                source,
            )
        }
        None => ("registration failed", "see the cause below", source),
    })
}

impl crate::conn::QueuePairs for VerbsNic {
    fn connect(
        &self,
        connect: &Connect,
        tag: u64,
    ) -> Result<(Box<dyn Send>, Vec<u8>), proto::Status> {
        let (qp, local, table, caps) = self.accept(connect).map_err(|e| {
            tracing::warn!(
                "NIC {}: cannot set up a queue pair for {}: {}",
                self.nic,
                connect.endpoint.ip,
                telemetry::logging::error_chain(&e)
            );
            proto::Status::IoError
        })?;
        let accept = qp::Accept::new(local, &table)
            .map_err(|_| proto::Status::IoError)?
            .with_caps(caps);
        let frame = proto::Message::QpAccept(accept)
            .encode_to_vec(tag)
            .map_err(|_| proto::Status::IoError)?;
        tracing::info!(
            "NIC {}: queue pair {:#x} for {} (QPN {:#x})",
            self.nic,
            local.qpn,
            connect.endpoint.ip,
            connect.endpoint.qpn
        );
        Ok((Box::new(qp), frame))
    }
}
