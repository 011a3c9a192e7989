//! The ids the device's modules share: client connections, server links and
//! a link's class. A leaf module, so that the forwarding core and the modules
//! it uses (deadlines, budgets, metrics, reconnects, uplinks) can all name
//! them without importing one another.

/// A client connection, as the driver numbers them.
pub type ConnId = u64;

/// A link to a server NIC, numbered by the core; stable across reloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub u32);

/// Which of a server NIC's two connections a link is: the one for small
/// requests or the one for bulk transfers. The server runs each connection
/// on its own thread and in order, so small requests never queue behind
/// large ones, on the wire or in the server. (Not to be confused with an
/// exactly-once request id's lane bits.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// Requests moving less than the forwarding core's `BULK_MIN_BYTES`.
    Main,
    /// Requests moving `BULK_MIN_BYTES` or more.
    Bulk,
}

impl LinkClass {
    /// `main` or `bulk`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkClass::Main => "main",
            LinkClass::Bulk => "bulk",
        }
    }
}
