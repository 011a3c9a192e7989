//! After a run on a replicated topology: every serving copy of every
//! replicated region, compared byte for byte in the servers' region files
//! (the data after each file's header; headers differ per copy, they hold
//! each copy's own key and generation).
//!
//! A copy lives in its server's data folder (`<data dir>/<server>/<region>.pmem`)
//! or, when its PMEM device names a directory, there. Copies on device DAX
//! are not compared (said in the result).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use pmem_server::region_file::{HEADER_LEN, region_path};
use serde::{Deserialize, Serialize};
use topology::{Replica, Topology};

/// How much of two copies is read at a time.
const CHUNK: usize = 1 << 20;

/// What comparing the copies found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaComparison {
    /// Regions whose serving copies (two or more) were compared.
    pub regions_compared: usize,
    /// Of those, the regions whose copies are identical.
    pub identical: usize,
    /// One line per region whose copies differ: the region, the servers,
    /// the first offset that differs and how many bytes do.
    pub differences: Vec<String>,
    /// Regions (or copies) that could not be compared, and why.
    pub not_compared: Vec<String>,
}

impl ReplicaComparison {
    /// Whether every compared region's copies are identical.
    pub fn identical(&self) -> bool {
        self.differences.is_empty()
    }

    /// One line: `identical: N regions`, or how many differ.
    pub fn summary(&self) -> String {
        let mut line = if self.identical() {
            format!("identical: {} regions", self.identical)
        } else {
            format!(
                "{} of {} regions differ between copies",
                self.differences.len(),
                self.regions_compared
            )
        };
        if !self.not_compared.is_empty() {
            line.push_str(&format!("; {} not compared", self.not_compared.len()));
        }
        line
    }
}

/// Where the copy `replica` of `region` keeps its file, `None` on device
/// DAX (no file to read).
fn copy_file(
    topology: &Topology,
    data_dir: &Path,
    region: &str,
    replica: &Replica,
) -> Option<PathBuf> {
    let device_path = topology
        .servers
        .iter()
        .find(|s| s.id == replica.server)
        .and_then(|s| s.sockets.iter().find(|k| k.id == replica.socket))
        .and_then(|k| k.devices.iter().find(|d| d.id == replica.device))
        .and_then(|d| d.path.clone());
    let folder = match device_path {
        Some(path) if Path::new(&path).is_dir() => PathBuf::from(path),
        Some(_) => return None,
        None => data_dir.join(replica.server.as_str()),
    };
    region_path(&folder, region).ok()
}

/// One line for the report: each replicated region's owner device, record
/// version and copies' states as the map says at the end of a run
/// (`replica sets at the end: PA.1 owner B version 2 (A serving, B
/// syncing); ...`), so a takeover shows.
pub fn owners_note(records: &[control::ReplicaSetRecord]) -> String {
    let sets: Vec<String> = records
        .iter()
        .map(|r| {
            let copies: Vec<String> = r
                .copies
                .iter()
                .map(|c| format!("{} {}", c.server, c.state))
                .collect();
            format!(
                "{} owner {} version {} ({})",
                r.region,
                r.owner,
                r.version,
                copies.join(", ")
            )
        })
        .collect();
    format!("replica sets at the end: {}", sets.join("; "))
}

/// How two copies differ: the first offset (into the region's data) and
/// how many bytes differ; `None` when they are identical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Difference {
    /// The first offset that differs.
    pub first: u64,
    /// Bytes that differ (a length difference counts every missing byte).
    pub bytes: u64,
}

/// Compares the data of two region files (after their headers).
pub fn compare_files(a: &Path, b: &Path) -> std::io::Result<Option<Difference>> {
    let open = |path: &Path| -> std::io::Result<(File, u64)> {
        let mut file = File::open(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let len = file.metadata()?.len().saturating_sub(HEADER_LEN);
        file.seek(SeekFrom::Start(HEADER_LEN))?;
        Ok((file, len))
    };
    let (mut fa, len_a) = open(a)?;
    let (mut fb, len_b) = open(b)?;
    let common = len_a.min(len_b);
    let (mut ba, mut bb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut first = None;
    let mut bytes = len_a.abs_diff(len_b);
    let mut at = 0u64;
    while at < common {
        let n = (common - at).min(CHUNK as u64) as usize;
        fa.read_exact(&mut ba[..n])?;
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            for (i, (x, y)) in ba[..n].iter().zip(&bb[..n]).enumerate() {
                if x != y {
                    first.get_or_insert(at + i as u64);
                    bytes += 1;
                }
            }
        }
        at += n as u64;
    }
    if first.is_none() && len_a != len_b {
        first = Some(common);
    }
    Ok(first.map(|first| Difference { first, bytes }))
}

/// Compares every replicated region's copies that `serving(region,
/// server)` says serve, each against the first of them, in the region
/// files under `data_dir` (the run's data folder, one folder per server).
pub fn compare_copies(
    topology: &Topology,
    data_dir: &Path,
    serving: &dyn Fn(&str, &str) -> bool,
) -> ReplicaComparison {
    let mut result = ReplicaComparison::default();
    for set in topology.replica_sets().iter().filter(|s| s.is_replicated()) {
        let region = set.region.as_str();
        let copies: Vec<&Replica> = set
            .replicas
            .iter()
            .filter(|r| serving(region, r.server.as_str()))
            .collect();
        if copies.len() < 2 {
            result.not_compared.push(format!(
                "region {region}: {} serving copy, nothing to compare it with",
                copies.len()
            ));
            continue;
        }
        let mut files = Vec::new();
        for copy in &copies {
            match copy_file(topology, data_dir, region, copy) {
                Some(path) => files.push((copy.server.as_str(), path)),
                None => result.not_compared.push(format!(
                    "region {region}: the copy on {} is on device DAX (no file to read)",
                    copy.server
                )),
            }
        }
        if files.len() < 2 {
            continue;
        }
        result.regions_compared += 1;
        let (first_server, first_file) = &files[0];
        let mut same = true;
        for (server, file) in &files[1..] {
            match compare_files(first_file, file) {
                Ok(None) => {}
                Ok(Some(d)) => {
                    same = false;
                    result.differences.push(format!(
                        "region {region}: the copies on {first_server} and {server} differ \
                         from offset {:#x} ({} bytes differ; {} and {})",
                        d.first,
                        d.bytes,
                        first_file.display(),
                        file.display()
                    ));
                }
                Err(e) => {
                    same = false;
                    result.differences.push(format!(
                        "region {region}: the copies on {first_server} and {server} cannot be \
                         compared: {e}"
                    ));
                }
            }
        }
        if same {
            result.identical += 1;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::EnvOverrides;

    fn replicated() -> Topology {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/replicated.toml");
        Topology::load_with(path, &EnvOverrides::None).expect("configs/replicated.toml")
    }

    /// A region file: a header of `header` bytes, then `data`.
    fn write(dir: &Path, server: &str, region: &str, header: u8, data: &[u8]) {
        let folder = dir.join(server);
        std::fs::create_dir_all(&folder).unwrap();
        let mut bytes = vec![header; HEADER_LEN as usize];
        bytes.extend_from_slice(data);
        std::fs::write(folder.join(format!("{region}.pmem")), bytes).unwrap();
    }

    fn all_copies(dir: &Path, data: impl Fn(&str, &str) -> Vec<u8>) {
        for region in ["PA.1", "PA.2", "PB.1", "PB.2"] {
            for (n, server) in ["A", "B"].into_iter().enumerate() {
                write(dir, server, region, n as u8, &data(region, server));
            }
        }
    }

    #[test]
    fn identical_copies_with_different_headers_are_identical() {
        let dir = tempfile::tempdir().unwrap();
        all_copies(dir.path(), |region, _| region.repeat(3000).into_bytes());
        let result = compare_copies(&replicated(), dir.path(), &|_, _| true);
        assert_eq!(result.regions_compared, 4);
        assert!(result.identical(), "{result:?}");
        assert_eq!(result.summary(), "identical: 4 regions");
    }

    #[test]
    fn a_differing_byte_is_named_with_its_region_servers_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        all_copies(dir.path(), |region, server| {
            let mut data = vec![7u8; 3 * CHUNK];
            if region == "PB.1" && server == "B" {
                data[CHUNK + 0x10] = 8;
                data[CHUNK + 0x20] = 9;
            }
            data
        });
        let result = compare_copies(&replicated(), dir.path(), &|_, _| true);
        assert_eq!(result.identical, 3);
        assert_eq!(result.differences.len(), 1, "{result:?}");
        let line = &result.differences[0];
        assert!(
            line.starts_with(
                "region PB.1: the copies on B and A differ from offset 0x100010 (2 bytes differ"
            ),
            "{line}"
        );
        assert_eq!(result.summary(), "1 of 4 regions differ between copies");
    }

    #[test]
    fn a_shorter_copy_differs_and_an_offline_copy_is_not_compared() {
        let dir = tempfile::tempdir().unwrap();
        all_copies(dir.path(), |region, server| {
            let len = if region == "PA.2" && server == "A" {
                100
            } else {
                164
            };
            vec![1u8; len]
        });
        let d = compare_files(
            &dir.path().join("A/PA.2.pmem"),
            &dir.path().join("B/PA.2.pmem"),
        )
        .unwrap();
        assert_eq!(
            d,
            Some(Difference {
                first: 100,
                bytes: 64
            })
        );
        // B's copy of PA.2 offline: only one serving copy to look at.
        let result = compare_copies(&replicated(), dir.path(), &|region, server| {
            !(region == "PA.2" && server == "B")
        });
        assert!(result.identical(), "{result:?}");
        assert_eq!(result.regions_compared, 3);
        assert_eq!(
            result.not_compared,
            ["region PA.2: 1 serving copy, nothing to compare it with"]
        );
        assert_eq!(result.summary(), "identical: 3 regions; 1 not compared");
    }

    #[test]
    fn a_missing_file_is_a_difference_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        all_copies(dir.path(), |_, _| vec![0u8; 10]);
        std::fs::remove_file(dir.path().join("B/PB.2.pmem")).unwrap();
        let result = compare_copies(&replicated(), dir.path(), &|_, _| true);
        assert_eq!(result.differences.len(), 1);
        assert!(
            result.differences[0].contains("region PB.2")
                && result.differences[0].contains("B/PB.2.pmem"),
            "{result:?}"
        );
    }
}
