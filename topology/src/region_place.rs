//! One region's place in the flat PMEM address space ([`LayoutEntry`]) and
//! where an address lands in it ([`Location`]): the leaf that the layout,
//! its extent table and the allocator's metadata layout all build on.

use crate::addr::{AccessKey, PmemAddr, RegionIndex, RegionOffset};
use crate::ids::{PmemDeviceId, RegionId, ServerId, SocketId};
use crate::model::CachePolicy;

/// One region's place in the PMEM address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// First PMEM address of the region.
    pub start: PmemAddr,
    /// Length of the region in bytes.
    pub len: u64,
    /// The region's wire-level index (its position in config order).
    pub region: RegionIndex,
    /// The region's id.
    pub region_id: RegionId,
    /// The server that owns the region.
    pub server: ServerId,
    /// The owning server's position in config order.
    pub server_index: u16,
    /// The socket the region's device is attached to.
    pub socket: SocketId,
    /// The socket's position within its server.
    pub socket_index: u16,
    /// The PMEM device the region is carved from.
    pub device: PmemDeviceId,
    /// The region key requests for this region must carry, as far as the
    /// holder of this layout knows it: 0 (which opens nothing) until it is
    /// learnt from the server that made it ([`Layout::set_key`](crate::Layout::set_key)). Keys are
    /// not part of the topology nor of the layout's digest.
    pub key: AccessKey,
    /// The region's cache policy.
    pub cache: CachePolicy,
}

impl LayoutEntry {
    /// One past the last PMEM address of the region.
    pub fn end(&self) -> u64 {
        self.start.get() + self.len
    }

    /// Whether `addr` falls inside the region.
    pub fn contains(&self, addr: PmemAddr) -> bool {
        addr.get() >= self.start.get() && addr.get() - self.start.get() < self.len
    }
}

/// Where a PMEM address lands: the owning region and the offset inside it.
#[derive(Debug, Clone, Copy)]
pub struct Location<'a> {
    /// The region holding the address.
    pub entry: &'a LayoutEntry,
    /// The address as the owning server sees it.
    pub offset: RegionOffset,
}

impl Location<'_> {
    /// The server that owns the address.
    pub fn server(&self) -> &ServerId {
        &self.entry.server
    }

    /// The socket whose PMEM holds the address.
    pub fn socket(&self) -> &SocketId {
        &self.entry.socket
    }

    /// Bytes from the address to the end of its region.
    pub fn remaining(&self) -> u64 {
        self.entry.len - self.offset.offset
    }
}
