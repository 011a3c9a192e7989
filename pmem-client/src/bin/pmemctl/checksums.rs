//! `pmemctl scrub --checksums`: ask the servers to check their regions'
//! blocks against the checksums they recorded, and say what they found.

use std::fmt::Write as _;

use pmem_client::operator::RegionScrub;

/// One line per region, then one per block that no longer matches.
pub fn render(found: &[RegionScrub]) -> String {
    let mut text = String::new();
    for r in found {
        let _ = writeln!(
            text,
            "region {} (server {}): {} blocks of {} KiB: {} verified, {} recorded, {} unwatched, \
             {} mismatched",
            r.region,
            r.server,
            r.blocks,
            r.block_len / 1024,
            r.verified,
            r.recorded,
            r.unwatched,
            r.mismatches.len()
        );
        if r.unwatched > 0 {
            let _ = writeln!(
                text,
                "  not checked: region {} is written over RDMA, which its server does not see",
                r.region
            );
        }
        for block in &r.mismatches {
            let _ = writeln!(
                text,
                "  MISMATCH region {} block {block} (offset {:#x}, {} bytes): changed without a \
                 write the server executed",
                r.region,
                block * r.block_len,
                r.block_len
            );
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::RegionId;

    #[test]
    fn names_region_block_and_offset_of_each_mismatch() {
        let text = render(&[RegionScrub {
            region: RegionId::new("R1"),
            server: "S".into(),
            block_len: 65536,
            blocks: 64,
            verified: 61,
            recorded: 1,
            unwatched: 0,
            mismatches: vec![2, 5],
        }]);
        assert!(
            text.starts_with("region R1 (server S): 64 blocks of 64 KiB: 61 verified, 1 recorded"),
            "{text}"
        );
        assert!(
            text.contains("MISMATCH region R1 block 5 (offset 0x50000, 65536 bytes)"),
            "{text}"
        );
    }
}
