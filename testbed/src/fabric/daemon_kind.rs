//! Which of the fabric's two daemons a process is, a leaf every module
//! that starts, supervises or registers daemons shares.

/// Which daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DaemonKind {
    /// A pmem-server.
    PmemServer,
    /// A fabric-device.
    FabricDevice,
}

impl DaemonKind {
    /// The daemon's program name.
    pub fn program(self) -> &'static str {
        match self {
            DaemonKind::PmemServer => "pmem-server",
            DaemonKind::FabricDevice => "fabric-device",
        }
    }
}
