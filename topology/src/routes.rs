//! Routes from a client to a region: client RNIC → fabric device → server NIC.

use crate::ids::{ClientId, FabricDeviceId, NicId, PortId, RegionId, RnicId, ServerId};
use crate::model::Topology;

/// One way for a client to reach a region's server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// The client's RNIC the request leaves on.
    pub rnic: RnicId,
    /// The fabric device that RNIC is wired to.
    pub fabric_device: FabricDeviceId,
    /// The device port the RNIC is wired to.
    pub port: PortId,
    /// The server that owns the region.
    pub server: ServerId,
    /// The server NIC the device forwards to.
    pub server_nic: NicId,
    /// Whether that NIC sits on the region's own CPU socket; when it does not,
    /// the request crosses the socket interconnect.
    pub same_socket: bool,
}

impl Topology {
    /// Every path from `client` to `region`, best first: paths whose server
    /// NIC sits on the region's socket come before cross-socket ones; within
    /// each group, RNICs and links keep their config order. Empty when the
    /// client or region is unknown or nothing connects them.
    pub fn routes(&self, client: &ClientId, region: &RegionId) -> Vec<Path> {
        let Some(client) = self.client(client) else {
            return Vec::new();
        };
        let Some(place) = self.regions().find(|p| &p.region.id == region) else {
            return Vec::new();
        };
        let server = place.server;
        let mut paths = Vec::new();
        for rnic in &client.rnics {
            let Some(device) = self.fabric_device(&rnic.fabric_device) else {
                continue;
            };
            let Some(port) = rnic.port_on(device) else {
                continue;
            };
            for link in device.links.iter().filter(|l| l.server == server.id) {
                let Some(nic) = server.nic(&link.nic) else {
                    continue;
                };
                paths.push(Path {
                    rnic: rnic.id.clone(),
                    fabric_device: device.id.clone(),
                    port: port.id.clone(),
                    server: server.id.clone(),
                    server_nic: nic.id.clone(),
                    same_socket: nic.socket == place.socket.id,
                });
            }
        }
        paths.sort_by_key(|p| !p.same_socket);
        paths
    }
}
