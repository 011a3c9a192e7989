//! What can go wrong for an application, said precisely.

use std::fmt;

use proto::Status;
use topology::{PmemAddr, VirtAddr};

use crate::conn::ConnectError;
use crate::paths::{Failure, GiveUpReason};

/// One path that was tried for a request, and how it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriedPath {
    /// The RNIC.
    pub rnic: String,
    /// The fabric device it leads to.
    pub device: String,
    /// How the attempt failed.
    pub failure: Failure,
}

/// The paths a failed request tried, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tried(pub Vec<TriedPath>);

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no path was up");
        }
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let failure = match t.failure {
                Failure::ConnectionLost => "connection lost",
                Failure::Timeout => "timed out",
                Failure::ServerUnavailable => "server unavailable",
                Failure::Behind => "device behind on the map",
                Failure::NotOwner => "not the region's owner device",
                Failure::OwnerAway => "not the region's owner (whose paths were down)",
            };
            write!(f, "{} via {}: {failure}", t.rnic, t.device)?;
        }
        Ok(())
    }
}

/// Where a failed request was aimed: an application's virtual address, or
/// a PMEM address (the allocator's own metadata, which has no virtual one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    /// In the shared virtual address space.
    Virtual(VirtAddr),
    /// In the PMEM address space.
    Pmem(PmemAddr),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Virtual(vaddr) => write!(f, "{vaddr}"),
            Address::Pmem(pmem) => write!(f, "PMEM {pmem}"),
        }
    }
}

impl From<VirtAddr> for Address {
    fn from(vaddr: VirtAddr) -> Self {
        Address::Virtual(vaddr)
    }
}

impl From<PmemAddr> for Address {
    fn from(pmem: PmemAddr) -> Self {
        Address::Pmem(pmem)
    }
}

/// An operation on the pool that failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The address has no mapping.
    #[error("{at}: not mapped (no region or allocation holds it)")]
    Unmapped {
        /// The address.
        at: Address,
    },
    /// The server refused the key: the translation is stale (the memory was
    /// freed and its key rotated) or the key is wrong.
    #[error("{at}: access denied (stale translation or wrong key)")]
    AccessDenied {
        /// The address.
        at: Address,
    },
    /// The address belonged to an allocation that has been freed: its key
    /// was rotated and the page table no longer maps it.
    #[error("{at}: use after free (the allocation holding it was freed)")]
    UseAfterFree {
        /// The address.
        at: Address,
    },
    /// The client's allow-list or the region's bounds refuse the range.
    #[error("{at}: {len} bytes out of bounds")]
    OutOfBounds {
        /// The address.
        at: Address,
        /// The length asked for.
        len: u64,
    },
    /// An atomic on an address that is not 8-byte aligned.
    #[error("{at}: atomics need an 8-byte aligned address")]
    Misaligned {
        /// The address.
        at: Address,
    },
    /// A READ was answered with another number of bytes than it asked for.
    #[error("{at}: a read of {asked} bytes was answered with {got} bytes")]
    WrongLength {
        /// Where the piece read starts.
        at: Address,
        /// Bytes asked for.
        asked: u64,
        /// Bytes the answer carried.
        got: usize,
    },
    /// The server answered with an error status.
    #[error("{at}: server {server} answered {status}")]
    Rejected {
        /// The address.
        at: Address,
        /// The server.
        server: String,
        /// Its status.
        status: Status,
    },
    /// No path to the server works.
    #[error("{at}: no path to server {server} works ({reason}; tried {tried})")]
    NoPath {
        /// The address.
        at: Address,
        /// The server.
        server: String,
        /// Why the client stopped trying.
        reason: Reason,
        /// What was tried.
        tried: Tried,
    },
    /// A device answered `NOT_OWNER` for a replicated region whose owner
    /// device this client has no RNIC wired to.
    #[error(transparent)]
    NoPathToOwner(Box<NoPathToOwner>),
    /// Devices kept answering `NOT_OWNER` for a replicated region, also
    /// the one the client's map names as its owner.
    #[error(transparent)]
    OwnerNotFound(Box<OwnerNotFound>),
    /// The pool is shutting down.
    #[error("the pool is closed")]
    Closed,
}

/// A replicated region's owner device that the client has no RNIC to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{at}: region {region} is ordered by its owner, fabric device {owner}, and client {client} \
     has no RNIC wired to it (its devices: {devices}); wire one of its RNICs to {owner} in the \
     topology (`testbed validate` names every such client)"
)]
pub struct NoPathToOwner {
    /// The address.
    pub at: Address,
    /// The region.
    pub region: String,
    /// Its owner device.
    pub owner: String,
    /// The client.
    pub client: String,
    /// The devices the client's RNICs are wired to.
    pub devices: String,
}

/// A replicated region whose owner the devices tried kept denying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{at}: the devices tried answered NOT_OWNER for region {region} {times} times (its owner is \
     fabric device {owner} in the client's map at epoch {epoch}; tried {tried}); the owner \
     moved and the client's map does not say where yet"
)]
pub struct OwnerNotFound {
    /// The address.
    pub at: Address,
    /// The region.
    pub region: String,
    /// Its owner in the client's map.
    pub owner: String,
    /// The epoch of that map.
    pub epoch: u64,
    /// How many NOT_OWNER answers came.
    pub times: usize,
    /// What was tried.
    pub tried: Tried,
}

/// Why a request gave up, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub GiveUpReason);

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            GiveUpReason::NoPath => "no path is up",
            GiveUpReason::AllFailed => "every path failed",
            GiveUpReason::Deadline => "the operation deadline passed",
        })
    }
}

/// A pool that could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The topology has problems (listed once: the list is the message).
    #[error(transparent)]
    Topology(#[from] topology::ValidationErrors),
    /// The layout cannot be built.
    #[error("invalid layout")]
    Layout(#[from] topology::LayoutError),
    /// The client and its paths cannot be set up.
    #[error(transparent)]
    Paths(#[from] crate::paths::PathError),
    /// The client's key file cannot be used.
    #[error("the client's key")]
    Secrets(#[from] topology::secrets::SecretError),
    /// No path could be connected; each one's failure is listed.
    #[error("client {client}: no fabric device could be reached: {}", list(.failures))]
    Unreachable {
        /// The client.
        client: String,
        /// Each path's failure.
        failures: Vec<(String, ConnectError)>,
    },
    /// A device refused the client or disagrees with its topology: not
    /// something a retry fixes.
    #[error("client {client}: path {path}")]
    Refused {
        /// The client.
        client: String,
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: Box<ConnectError>,
    },
    /// The runtime for the blocking API could not start.
    #[error("cannot start the I/O runtime")]
    Runtime(#[source] std::io::Error),
    /// The pool's map could not be read from etcd, or its watch started.
    #[error("the map of pool {pool} in etcd")]
    Etcd {
        /// The pool.
        pool: String,
        /// Why.
        #[source]
        source: control::ControlError,
    },
    /// The etcd credentials file cannot be used.
    #[error("the etcd credentials")]
    EtcdCredentials(#[from] control::CredentialsError),
    /// `$PMEM_FABRIC_ETCD` is not set.
    #[error(
        "$PMEM_FABRIC_ETCD is not set: name etcd's client URLs there \
         (http://HOST:PORT[,http://HOST:PORT…]) or pass them to AsyncPool::builder_on_etcd"
    )]
    NoEtcd,
    /// `$PMEM_FABRIC_ETCD` does not name etcd endpoints.
    #[error("$PMEM_FABRIC_ETCD")]
    EtcdEndpoints(#[from] control::endpoints::EndpointsError),
}

fn list(failures: &[(String, ConnectError)]) -> String {
    failures
        .iter()
        .map(|(path, e)| format!("{path}: {}", crate::error_chain(e)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_which_address_space_they_mean() {
        let virt = PoolError::Unmapped {
            at: VirtAddr(0x1_0000_0040).into(),
        };
        let pmem = PoolError::Unmapped {
            at: PmemAddr(0x40).into(),
        };
        assert_eq!(
            virt.to_string(),
            "0x100000040: not mapped (no region or allocation holds it)"
        );
        assert_eq!(
            pmem.to_string(),
            "PMEM 0x40: not mapped (no region or allocation holds it)"
        );
    }

    #[test]
    fn owner_errors_name_the_region_the_owner_and_the_clients_devices() {
        let none = PoolError::NoPathToOwner(Box::new(NoPathToOwner {
            at: VirtAddr(0x1_0000_0040).into(),
            region: "PA.2".into(),
            owner: "B".into(),
            client: "c1".into(),
            devices: "A".into(),
        }));
        assert_eq!(
            none.to_string(),
            "0x100000040: region PA.2 is ordered by its owner, fabric device B, and client c1 \
             has no RNIC wired to it (its devices: A); wire one of its RNICs to B in the \
             topology (`testbed validate` names every such client)"
        );
        let lost = PoolError::OwnerNotFound(Box::new(OwnerNotFound {
            at: PmemAddr(0x40).into(),
            region: "PA.1".into(),
            owner: "A".into(),
            epoch: 3,
            times: 4,
            tried: Tried(vec![TriedPath {
                rnic: "r0".into(),
                device: "A".into(),
                failure: Failure::NotOwner,
            }]),
        }));
        let text = lost.to_string();
        assert!(
            text.contains("NOT_OWNER for region PA.1 4 times")
                && text.contains("fabric device A in the client's map at epoch 3")
                && text.contains("r0 via A: not the region's owner device"),
            "{text}"
        );
    }
}
