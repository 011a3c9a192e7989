//! A region's block checksums kept across a clean restart.
//!
//! At a clean stop the server writes each scrubbed region's checksums to
//! `<region>.sums` in the data directory, without those of blocks written
//! since they were recorded. The next start loads the file when it was
//! written for the region's previous open (its generation) and removes it
//! before serving, so a later crash never leaves checksums behind that
//! writes after the start made stale: after a crash the first scrub
//! records every block again.
//!
//! ```text
//! 0..8    magic       b"PMFSUMS1"
//! 8..16   block_len   u64
//! 16..24  generation  u64 the region header's generation when saved
//! 24..32  blocks      u64
//! 32..40  checksum    u64: CRC-32 of bytes 0..32 and the sums
//! 40..    sums        u64 per block, 0 for none
//! ```
//!
//! A file that does not fit the region or fails its checksum is logged and
//! ignored: the region's blocks are recorded again.

use std::io;
use std::path::{Path, PathBuf};

use crate::block_sums::{BLOCK_LEN, BlockSums};
use crate::region_file::RegionFile;

const MAGIC: [u8; 8] = *b"PMFSUMS1";
const HEADER_LEN: usize = 40;

/// Why saved checksums were not used or not saved.
#[derive(Debug, thiserror::Error)]
pub enum SumsFileError {
    /// Reading, writing or removing the file failed.
    #[error("{path}: cannot {op}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not checksums for this open of the region.
    #[error("{path}: {what}; the region's blocks will be recorded again")]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
}

/// Where the checksums of `region` are saved in `data_dir`.
pub fn sums_path(data_dir: &Path, region: &str) -> PathBuf {
    data_dir.join(format!("{region}.sums"))
}

fn crc(header: &[u8], sums: &[u8]) -> u64 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(header);
    hasher.update(sums);
    u64::from(hasher.finalize())
}

/// Writes the checksums of `file`'s region, if a scrub recorded any, to
/// `path` (replacing it atomically and durably).
pub fn save(path: &Path, file: &RegionFile) -> Result<(), SumsFileError> {
    let Some(sums) = file.sums.saved_sums() else {
        return Ok(());
    };
    let io_err = |op| {
        move |source| SumsFileError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN + sums.len() * 8);
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&BLOCK_LEN.to_le_bytes());
    bytes.extend_from_slice(&file.header.generation.to_le_bytes());
    bytes.extend_from_slice(&(sums.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    for sum in &sums {
        bytes.extend_from_slice(&sum.to_le_bytes());
    }
    let sum = crc(&bytes[..32], &bytes[HEADER_LEN..]);
    bytes[32..40].copy_from_slice(&sum.to_le_bytes());
    let tmp = path.with_extension("sums.tmp");
    {
        use std::io::Write;
        let mut out = std::fs::File::create(&tmp).map_err(io_err("create"))?;
        out.write_all(&bytes)
            .and_then(|()| out.sync_all())
            .map_err(io_err("write"))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err("replace"))
}

/// The checksums saved at `path` for `file`'s region at its previous open,
/// as the region's [`BlockSums`]; `None` when there is no file. The file is
/// removed before this returns, whether it is used or not.
pub fn load(path: &Path, file: &RegionFile) -> Result<Option<BlockSums>, SumsFileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SumsFileError::Io {
                path: path.to_path_buf(),
                op: "read",
                source,
            });
        }
    };
    std::fs::remove_file(path).map_err(|source| SumsFileError::Io {
        path: path.to_path_buf(),
        op: "remove",
        source,
    })?;
    let unusable = |what: String| SumsFileError::Unusable {
        path: path.to_path_buf(),
        what,
    };
    if bytes.len() < HEADER_LEN || bytes[..8] != MAGIC {
        return Err(unusable("not a checksum file".into()));
    }
    let u64_at = |at: usize| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(raw)
    };
    let (block_len, generation, blocks) = (u64_at(8), u64_at(16), u64_at(24));
    let expected_len = blocks
        .checked_mul(8)
        .and_then(|n| n.checked_add(HEADER_LEN as u64));
    if expected_len != Some(bytes.len() as u64) {
        return Err(unusable(format!(
            "{} bytes, not the length its {blocks} blocks need",
            bytes.len()
        )));
    }
    if crc(&bytes[..32], &bytes[HEADER_LEN..]) != u64_at(32) {
        return Err(unusable("checksum mismatch".into()));
    }
    if block_len != BLOCK_LEN {
        return Err(unusable(format!(
            "blocks of {block_len} bytes, not {BLOCK_LEN}"
        )));
    }
    if generation.checked_add(1) != Some(file.header.generation) {
        return Err(unusable(format!(
            "saved at generation {generation}, but the region is now at generation {} (it was \
             opened without a clean stop in between, or recreated)",
            file.header.generation
        )));
    }
    let sums = bytes[HEADER_LEN..]
        .chunks_exact(8)
        .map(|c| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(c);
            u64::from_le_bytes(raw)
        })
        .collect();
    BlockSums::with_sums(file.data_len(), sums)
        .map(Some)
        .ok_or_else(|| unusable(format!("{blocks} blocks, not the region's")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::PersistPolicy;
    use topology::{Layout, Topology};

    /// Region R1 (1 MiB: 16 blocks) opened in `dir`, scrubbed once.
    fn scrubbed(dir: &Path) -> RegionFile {
        let path = testkit::write_topology(dir, &[("R1", "1MiB")]);
        let topology = Topology::load(&path).unwrap();
        let layout = Layout::new(&topology).unwrap();
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let file =
            RegionFile::open(&data, &layout.entries()[0], &PersistPolicy::Msync, false).unwrap();
        file.sums.scrub(&file.map, 0, 0, 16).unwrap();
        file
    }

    /// `file` as the next open sees it.
    fn next_open(mut file: RegionFile) -> RegionFile {
        file.header.generation += 1;
        file
    }

    #[test]
    fn saved_sums_load_once_at_the_next_generation() {
        let dir = tempfile::tempdir().unwrap();
        let file = scrubbed(dir.path());
        let at = dir.path().join("R1.sums");
        save(&at, &file).unwrap();
        let file = next_open(file);
        let sums = load(&at, &file).unwrap().expect("loaded");
        assert_eq!(sums.saved_sums(), file.sums.saved_sums());
        assert!(!at.exists());
        assert!(load(&at, &file).unwrap().is_none());
    }

    #[test]
    fn unusable_files_are_refused_naming_the_file_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = scrubbed(dir.path());
        let at = dir.path().join("R1.sums");
        let refused = |file: &RegionFile, bytes: Option<Vec<u8>>| {
            save(&at, file).unwrap();
            if let Some(bytes) = bytes {
                std::fs::write(&at, bytes).unwrap();
            }
            let err = load(&at, file).map(|_| ()).unwrap_err().to_string();
            assert!(!at.exists());
            assert!(err.contains("R1.sums"), "{err}");
            err
        };
        // Loaded by the same open: not the next generation.
        assert!(refused(&file, None).contains("generation"));
        let file = next_open(file);
        save(&at, &file).unwrap();
        let good = std::fs::read(&at).unwrap();
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 3] ^= 1;
        let err = refused(&file, Some(flipped));
        assert!(err.contains("checksum mismatch"), "{err}");
        let err = refused(&file, Some(good[..good.len() - 1].to_vec()));
        assert!(err.contains("not the length"), "{err}");
        let err = refused(&file, Some(b"short".to_vec()));
        assert!(err.contains("not a checksum file"), "{err}");
    }
}
