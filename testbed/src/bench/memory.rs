//! What idle client connections cost the fabric device in memory: many
//! connections opened and proven, the device's resident set read before,
//! with them open, and once they have been idle a while.

use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::client::BenchConn;
use super::{Paths, peers};

/// What idle client connections cost the fabric device in memory.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ConnectionMemory {
    /// Connections opened (HELLO, and the proof with keys) and held while
    /// measuring.
    pub connections: usize,
    /// The device's resident set before, bytes.
    pub rss_before: u64,
    /// With the connections open, bytes.
    pub rss_after: u64,
    /// (after − before) ÷ connections.
    pub bytes_per_connection: f64,
    /// With the connections open and idle for [`IDLE_SETTLE`] (a device
    /// gives an idle connection's buffers back), bytes.
    #[serde(default)]
    pub rss_idle: u64,
    /// (idle − before) ÷ connections.
    #[serde(default)]
    pub idle_bytes_per_connection: f64,
}

/// How long the idle connections stay idle before the device's memory is
/// read again: past the second after which a device gives an idle
/// connection's buffers back.
pub const IDLE_SETTLE: Duration = Duration::from_millis(2500);

/// Opens `count` client connections to the fabric device (each says
/// HELLO, proves the client's key and waits for the answer, so the device
/// has set it up), and measures the device's resident memory before, with
/// them just open, and once they have been idle for [`IDLE_SETTLE`].
pub(super) fn connection_memory(
    paths: &Paths,
    device: u32,
    count: usize,
) -> anyhow::Result<ConnectionMemory> {
    let count = count.max(1);
    let rss_before = peers::resident_bytes(device)?;
    // Only the sockets are kept: the bench's own buffers of 10,000
    // connections would be gigabytes of address space for nothing.
    let mut conns = Vec::with_capacity(count);
    let open = || -> std::io::Result<std::net::TcpStream> {
        let stream = std::net::TcpStream::connect(paths.fabric)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        BenchConn::open_stream(stream, "c", paths.key)
    };
    for i in 0..count {
        let conn = open().with_context(|| {
            format!(
                "open idle client connection {} of {count} to the fabric device at {}",
                i + 1,
                paths.fabric
            )
        })?;
        conns.push(conn);
    }
    let rss_after = peers::resident_bytes(device)?;
    std::thread::sleep(IDLE_SETTLE);
    let rss_idle = peers::resident_bytes(device)?;
    drop(conns);
    let per_connection = |rss: u64| rss.saturating_sub(rss_before) as f64 / count as f64;
    Ok(ConnectionMemory {
        connections: count,
        rss_before,
        rss_after,
        bytes_per_connection: per_connection(rss_after),
        rss_idle,
        idle_bytes_per_connection: per_connection(rss_idle),
    })
}
