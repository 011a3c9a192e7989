//! Typed identifiers for the named things of a topology.
//!
//! Every id is the name written in the config file. Distinct types keep a
//! server id from being used where a region id is meant.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! name_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// An id with the given name.
            pub fn new(name: impl AsRef<str>) -> Self {
                Self(Arc::from(name.as_ref()))
            }

            /// The name as written in the config.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d).map(Self::new)
            }
        }
    };
}

name_id!(
    /// A PMEM server (a DAX host).
    ServerId
);
name_id!(
    /// A CPU socket, unique within its server.
    SocketId
);
name_id!(
    /// A PMEM device (DIMM set), unique within its socket.
    PmemDeviceId
);
name_id!(
    /// A PMEM region, unique in the whole pool.
    RegionId
);
name_id!(
    /// A server NIC, unique within its server.
    NicId
);
name_id!(
    /// A fabric device (one per switch node).
    FabricDeviceId
);
name_id!(
    /// A client-facing port of a fabric device, unique within the device.
    PortId
);
name_id!(
    /// A client host.
    ClientId
);
name_id!(
    /// An RDMA NIC of a client, unique within the client.
    RnicId
);
