//! Where the power-cut server keeps its regions, and the topology and guest
//! set-up each medium takes.

use serde::Serialize;
use topology::Topology;

/// The guest's address on the lab bridge, where its server listens.
pub(super) const GUEST_IP: &str = "10.77.0.2";
/// The port of the server's NIC.
pub(super) const NIC_PORT: u16 = 7000;
/// The port of the server's admin endpoint.
const ADMIN_PORT: u16 = 9100;
/// Where the (never started) fabric device's port would listen: the host.
const DEVICE_PORT: &str = "10.77.0.100:7100";

/// The device path a [`Medium::Devdax`] server's PMEM device names.
const DEVDAX_PATH: &str = "/dev/dax0.0";

/// The server's topology on `medium`: one server `S` in the guest with one
/// 8 MiB region on PMEM device `pmem0` (on device DAX at `/dev/dax0.0`),
/// its NIC `n0` on the guest's address; one fabric device `F` and one
/// client `c` (number 0, the driver's exactly-once identity). Only the
/// server runs.
pub fn topology(medium: Medium) -> Topology {
    let mut topology = testkit::FabricSpec::new()
        .server("S", &[("S1", "8MiB")])
        .device("F")
        .client("c")
        .topology();
    topology.pool.name = "power-cut".to_owned();
    for server in &mut topology.servers {
        server.admin = Some(format!("{GUEST_IP}:{ADMIN_PORT}"));
        for nic in &mut server.nics {
            nic.listen = format!("{GUEST_IP}:{NIC_PORT}");
        }
        for device in server.sockets.iter_mut().flat_map(|s| &mut s.devices) {
            if medium == Medium::Devdax {
                device.path = Some(DEVDAX_PATH.to_owned());
            }
        }
    }
    for port in topology
        .fabric_devices
        .iter_mut()
        .flat_map(|d| &mut d.ports)
    {
        port.listen = DEVICE_PORT.to_owned();
    }
    topology
}

/// Where the server in the guest keeps its regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// A virtio disk with ext4; persistence by msync(2).
    Disk,
    /// An emulated NVDIMM as an fsdax namespace with ext4 mounted `-o
    /// dax`; persistence by `MAP_SYNC` and cache-line write-back.
    Fsdax,
    /// An emulated NVDIMM as a device DAX namespace (`/dev/dax0.0`) holding
    /// the regions, next to a virtio disk for the data directory;
    /// persistence by cache-line write-back.
    Devdax,
}

impl Medium {
    /// The persistence mechanism the server is asked for: on device DAX
    /// `auto`, so that the exactly-once window on the disk takes msync.
    pub(super) fn persistence(self) -> &'static str {
        match self {
            Medium::Disk => "msync",
            Medium::Fsdax => "dax",
            Medium::Devdax => "auto",
        }
    }

    /// The mode the server must report for its regions.
    pub(super) fn mode(self) -> &'static str {
        match self {
            Medium::Disk => "msync",
            Medium::Fsdax => "dax",
            Medium::Devdax => "devdax",
        }
    }

    /// The line the server must log about its PMEM device: where its
    /// regions are, on what, and its NUMA node.
    pub(super) fn device_line(self) -> String {
        let (place, kind, node) = match self {
            Medium::Disk => ("/data/S (data dir)", "files on vda", "NUMA node unknown"),
            Medium::Fsdax => ("/data/S (data dir)", "fsdax on pmem0", "NUMA node 0"),
            Medium::Devdax => (DEVDAX_PATH, "devdax", "NUMA node 0"),
        };
        format!("pmem device pmem0 of socket 0: {place}, {kind}, {node}, 1 region")
    }

    /// Whether the guest gets the virtio disk.
    pub(super) fn has_disk(self) -> bool {
        matches!(self, Medium::Disk | Medium::Devdax)
    }

    /// Whether the guest gets the NVDIMM.
    pub(super) fn has_nvdimm(self) -> bool {
        matches!(self, Medium::Fsdax | Medium::Devdax)
    }

    /// The guest's lines that put the data folder in place at /data.
    pub(super) fn mount(self) -> &'static str {
        match self {
            Medium::Disk => "mount -t ext4 /dev/vda /data\n",
            // The first boot turns the raw namespace into fsdax (an info
            // block on the NVDIMM, so later boots find it) and makes the
            // filesystem.
            Medium::Fsdax => {
                "i=0; while [ ! -e /dev/pmem0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
                 if [ \"$(cat /sys/block/pmem0/queue/dax)\" != 1 ]; then\n\
                 ndctl create-namespace --force --reconfig namespace0.0 --mode fsdax --align 2M\n\
                 mkfs.ext4 -q -F -b 4096 /dev/pmem0\nfi\n\
                 mount -t ext4 -o dax /dev/pmem0 /data\n"
            }
            // The first boot turns the raw namespace into device DAX; later
            // boots find /dev/dax0.0 by its info block.
            Medium::Devdax => {
                "mount -t ext4 /dev/vda /data\n\
                 i=0; while [ ! -e /dev/pmem0 ] && [ ! -e /dev/dax0.0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
                 if [ ! -e /dev/dax0.0 ]; then\n\
                 ndctl create-namespace --force --reconfig namespace0.0 --mode devdax --align 2M\nfi\n"
            }
        }
    }
}

impl std::fmt::Display for Medium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Medium::Disk => "msync on a virtio disk",
            Medium::Fsdax => "DAX on an emulated NVDIMM (fsdax, MAP_SYNC)",
            Medium::Devdax => "device DAX on an emulated NVDIMM (devdax, /dev/dax0.0)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_medium_has_one_server_region_on_the_guest_address() {
        for medium in [Medium::Disk, Medium::Fsdax, Medium::Devdax] {
            let written = toml::to_string(&topology(medium)).expect("toml");
            let topology =
                Topology::from_toml_str("power-cut", &written, &topology::EnvOverrides::None)
                    .expect("parses");
            assert!(topology.validate().is_ok(), "{medium}: {written}");
            assert_eq!(topology.pool.name, "power-cut");
            let server = &topology.servers[0];
            assert_eq!(server.nics[0].listen, "10.77.0.2:7000");
            assert_eq!(server.admin.as_deref(), Some("10.77.0.2:9100"));
            let device = &server.sockets[0].devices[0];
            assert_eq!(device.id.as_str(), "pmem0");
            let path = (medium == Medium::Devdax).then_some("/dev/dax0.0");
            assert_eq!(device.path.as_deref(), path, "{medium}");
            let layout = topology::Layout::new(&topology).expect("layout");
            assert_eq!(layout.entries().len(), 1);
            assert_eq!(layout.entries()[0].region_id.as_str(), "S1");
        }
    }
}
