//! Which persistence mechanism to use, as configured and as in effect.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use topology::Persistence;

use super::emulated::PowerDomain;

/// Which persistence mechanism a server should use: the topology's
/// [`Persistence`], with the power domain an emulated mapping belongs to.
#[derive(Debug, Clone)]
pub enum PersistPolicy {
    /// DAX where the file allows it, msync otherwise.
    Auto,
    /// DAX or nothing.
    Dax,
    /// msync.
    Msync,
    /// libpmem (build feature `libpmem`).
    Libpmem,
    /// The emulated persistence domain, for power-loss tests.
    Emulated(Arc<PowerDomain>),
}

impl PersistPolicy {
    /// The name the topology and `--persistence` give this policy.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Dax => "dax",
            Self::Msync => "msync",
            Self::Libpmem => "libpmem",
            Self::Emulated(_) => "emulated",
        }
    }
}

impl From<Persistence> for PersistPolicy {
    /// The configured mechanism; `emulated` joins the process's own power
    /// domain.
    fn from(persistence: Persistence) -> Self {
        match persistence {
            Persistence::Auto => Self::Auto,
            Persistence::Dax => Self::Dax,
            Persistence::Msync => Self::Msync,
            Persistence::Libpmem => Self::Libpmem,
            Persistence::Emulated => Self::Emulated(PowerDomain::process()),
        }
    }
}

/// The persistence mechanism actually in use for a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistMode {
    /// `MAP_SYNC` mapping; durability by cache-line write-back and SFENCE.
    Dax,
    /// Mapping of a device DAX character device (always synchronous);
    /// durability by cache-line write-back and SFENCE.
    #[serde(rename = "devdax")]
    DevDax,
    /// Ordinary shared file mapping; durability by msync(2).
    Msync,
    /// Mapped by libpmem; durability by `pmem_persist` on persistent memory,
    /// `pmem_msync` elsewhere.
    Libpmem,
    /// Private mapping in an emulated persistence domain (tests only).
    Emulated,
}

impl PersistMode {
    /// The name used in logs and metrics: `dax`, `devdax`, `msync`,
    /// `libpmem` or `emulated`.
    pub fn as_str(self) -> &'static str {
        match self {
            PersistMode::Dax => "dax",
            PersistMode::DevDax => "devdax",
            PersistMode::Msync => "msync",
            PersistMode::Libpmem => "libpmem",
            PersistMode::Emulated => "emulated",
        }
    }
}

impl fmt::Display for PersistMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names() {
        assert_eq!(PersistMode::Dax.to_string(), "dax");
        assert_eq!(PersistMode::Msync.as_str(), "msync");
        assert_eq!(PersistMode::Libpmem.to_string(), "libpmem");
        assert_eq!(PersistMode::DevDax.to_string(), "devdax");
    }
}
