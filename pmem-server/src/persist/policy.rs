//! Which persistence mechanism to use, as configured and as in effect.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which persistence mechanism a server should use: the topology's
/// [`topology::Persistence`] (`auto`, `dax`, `msync`, `libpmem`).
pub use topology::Persistence as PersistPolicy;

/// The persistence mechanism actually in use for a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistMode {
    /// `MAP_SYNC` mapping; durability by cache-line write-back and SFENCE.
    Dax,
    /// Ordinary shared file mapping; durability by msync(2).
    Msync,
    /// Mapped by libpmem; durability by `pmem_persist` on persistent memory,
    /// `pmem_msync` elsewhere.
    Libpmem,
}

impl PersistMode {
    /// The name used in logs and metrics: `dax`, `msync` or `libpmem`.
    pub fn as_str(self) -> &'static str {
        match self {
            PersistMode::Dax => "dax",
            PersistMode::Msync => "msync",
            PersistMode::Libpmem => "libpmem",
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
    }
}
