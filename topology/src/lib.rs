//! The pmem-fabric topology: a model of the whole fabric, read from a TOML file.
//!
//! - [`model`]: servers, sockets, PMEM devices and regions, server NICs, fabric
//!   devices with ports and links, clients with RNICs.
//! - [`load`]: reading the file through the `config` crate with `PMEMFABRIC_*`
//!   environment overrides.
//! - [`schema`]: the file's shape (keys, types, choices, sizes), every
//!   problem with its line and column or the variable that caused it.
//! - `tree`: the document as values that remember their line and column.
//! - [`validate`]: every problem of a topology, each naming the file and item.
//! - [`layout`]: the flat PMEM address space, a pure function of the topology,
//!   with O(log n) lookup and a digest daemons and clients compare.
//! - `region_place`: each region's place in the layout, a [`LayoutEntry`].
//! - `extent_table`: O(1) address lookup for dense layouts.
//! - [`meta`]: where the allocator's metadata lives in PMEM.
//! - [`records`]: how the allocator's metadata is encoded.
//! - [`region_header`]: a region header's fixed words and format state.
//! - [`routes`]: the ordered paths from a client to a region.
//! - [`replicas`]: each region's copies (primary and backups) on servers
//!   of distinct failure domains, named or placed by a deterministic rule.
//! - [`ids`]: typed names (server, socket, region, device, client).
//! - [`size`]: sizes such as `64MiB`.
//! - [`addr`]: the address newtypes.
//! - [`grants`]: what a client may touch, as PMEM address ranges.
//! - [`secrets`]: the principals' key files.
//! - [`host`]: the checks only a server's host can make (its PMEM device
//!   paths exist and are directories or device DAX character devices).
//!
//! Nothing here does I/O beyond reading the file, except [`host`].

/// The address newtypes, from the wire format (`proto::addr`).
pub mod addr {
    pub use proto::addr::*;
}
mod extent_table;
pub mod grants;
pub mod host;
pub mod ids;
pub mod layout;
pub mod load;
pub mod meta;
pub mod model;
pub mod records;
pub mod region_header;
mod region_place;
pub mod replicas;
pub mod routes;
pub mod schema;
pub mod secrets;
pub mod size;
mod tree;
pub mod validate;

pub use addr::{AccessKey, PmemAddr, RegionIndex, RegionOffset, VirtAddr};
pub use ids::{
    ClientId, FabricDeviceId, NicId, PmemDeviceId, PortId, RegionId, RnicId, ServerId, SocketId,
};
pub use layout::{Layout, LayoutEntry, LayoutError, Location};
pub use load::{EnvOverrides, LoadError};
pub use meta::{MetaError, MetaLayout, RegionMeta};
pub use model::{
    Access, AllocatorConfig, AllowRange, CachePolicy, Client, FabricDevice, FabricLink, FabricPort,
    NicTransport, Override, Persistence, PmemDevice, PoolSettings, Region, RegionReplicas, Rnic,
    RnicTransport, RocePort, Server, ServerNic, Socket, Topology,
};
pub use replicas::{PlacementProblem, Replica, ReplicaSet};
pub use routes::Path;
pub use size::ByteSize;
pub use validate::{Problem, ProblemKind, ValidationErrors, Warning};
