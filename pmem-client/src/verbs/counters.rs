//! The RDMA devices' hardware counters from sysfs
//! (`/sys/class/infiniband/<device>/ports/<port>/hw_counters/<name>`), as
//! rxe and most RNICs publish them.

use std::path::Path;

/// Where the kernel lists RDMA devices.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// One counter of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HwCounter {
    /// The device, e.g. `rxe0`.
    pub device: String,
    /// The port number.
    pub port: String,
    /// The counter's name, e.g. `rcvd_seq_err`.
    pub name: String,
    /// Its value.
    pub value: u64,
}

impl HwCounter {
    /// Whether the counter counts ICRC or sequence errors (which a clean
    /// run keeps at zero).
    pub fn is_integrity_error(&self) -> bool {
        let name = self.name.to_ascii_lowercase();
        name.contains("icrc") || name.contains("seq")
    }
}

/// Every readable counter under `root` (normally [`SYSFS_INFINIBAND`]),
/// sorted by device, port and name; empty when there are none.
pub fn hw_counters(root: &Path) -> Vec<HwCounter> {
    let mut out = Vec::new();
    let entries = |dir: &Path| -> Vec<(String, std::path::PathBuf)> {
        let mut list: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect();
        list.sort();
        list
    };
    for (device, device_dir) in entries(root) {
        for (port, port_dir) in entries(&device_dir.join("ports")) {
            for (name, file) in entries(&port_dir.join("hw_counters")) {
                let value = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|text| text.trim().parse().ok());
                if let Some(value) = value {
                    out.push(HwCounter {
                        device: device.clone(),
                        port: port.clone(),
                        name,
                        value,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_a_sysfs_like_tree() {
        let dir = tempfile::tempdir().expect("temp dir");
        let counters = dir.path().join("rxe0/ports/1/hw_counters");
        std::fs::create_dir_all(&counters).expect("mkdir");
        std::fs::write(counters.join("rcvd_pkts"), "42\n").expect("write");
        std::fs::write(counters.join("rcvd_seq_err"), "0\n").expect("write");
        std::fs::write(counters.join("lifespan"), "not a number\n").expect("write");
        let got = hw_counters(dir.path());
        let names: Vec<_> = got.iter().map(|c| (c.name.as_str(), c.value)).collect();
        assert_eq!(names, [("rcvd_pkts", 42), ("rcvd_seq_err", 0)]);
        assert!(got[1].is_integrity_error() && !got[0].is_integrity_error());
        assert!(hw_counters(&dir.path().join("missing")).is_empty());
    }
}
