//! `pmemctl scrub --replicas`: every copy of a replicated region compared
//! block by block (BLOCK_SUMS from each copy's server), the blocks that
//! differ reported with each copy's checksum, and the copy that is
//! damaged named when something decides it:
//!
//! - with three copies, the majority: the copies whose block differs from
//!   the one two copies agree on;
//! - otherwise, the checksums the servers recorded at rest (`pmemctl
//!   scrub --checksums`): the copy whose server finds the block changed
//!   without a write, when the other copies agree;
//! - with nothing to decide, nothing is named, and nothing repaired.
//!
//! The repair (`--repair`, the map in etcd) marks each damaged copy
//! `syncing`: its owner device then compares it with the deciding copy
//! and rewrites what differs, each block held against the application's
//! writes, and marks it `serving` again. A scrub never writes region data
//! itself, so it never races a write.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use pmem_client::operator::CopySums;

/// Why a block's copies differ, as far as can be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// These copies are damaged.
    Damaged {
        /// The servers of the damaged copies.
        servers: Vec<String>,
        /// What decided it.
        by: &'static str,
    },
    /// Nothing says which copy is damaged.
    Undecided(String),
}

/// One block whose copies differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The region.
    pub region: String,
    /// The block's index.
    pub block: u64,
    /// Bytes per block.
    pub block_len: u64,
    /// Each copy's server and checksum.
    pub sums: Vec<(String, u64)>,
    /// Which copy is damaged.
    pub verdict: Verdict,
}

/// The blocks whose checksums are not the same on every copy (a copy with
/// fewer blocks differs at each block it lacks).
pub fn differing(copies: &[CopySums]) -> Vec<u64> {
    let blocks = copies.iter().map(|c| c.sums.len()).max().unwrap_or(0);
    (0..blocks)
        .filter(|&b| {
            let mut sums = copies.iter().map(|c| c.sums.get(b).copied());
            let first = sums.next().flatten();
            first.is_none() || sums.any(|s| s != first)
        })
        .map(|b| b as u64)
        .collect()
}

/// Which of a block's copies is damaged: the majority decides, else the
/// checksums recorded at rest (`recorded_bad`: the servers that found the
/// block changed without a write), else nothing.
pub fn judge(sums: &[(String, u64)], recorded_bad: &[String]) -> Verdict {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, sum) in sums {
        *counts.entry(*sum).or_default() += 1;
    }
    if let Some((&good, _)) = counts.iter().find(|&(_, &n)| n * 2 > sums.len()) {
        return Verdict::Damaged {
            servers: sums
                .iter()
                .filter(|(_, s)| *s != good)
                .map(|(server, _)| server.clone())
                .collect(),
            by: "the majority of the copies",
        };
    }
    let sound: Vec<u64> = sums
        .iter()
        .filter(|(server, _)| !recorded_bad.contains(server))
        .map(|(_, sum)| *sum)
        .collect();
    let bad: Vec<String> = sums
        .iter()
        .filter(|(server, _)| recorded_bad.contains(server))
        .map(|(server, _)| server.clone())
        .collect();
    if !bad.is_empty() && !sound.is_empty() && sound.iter().all(|s| *s == sound[0]) {
        return Verdict::Damaged {
            servers: bad,
            by: "the checksum its server recorded at rest",
        };
    }
    let servers: Vec<&str> = sums.iter().map(|(s, _)| s.as_str()).collect();
    Verdict::Undecided(format!(
        "no majority among the copies on {} and no checksum recorded at rest says which one \
         is damaged (`pmemctl scrub --checksums` records them while the copies are sound); \
         nothing is overwritten",
        servers.join(", ")
    ))
}

/// The report: one line per region compared, then one per differing
/// block with each copy's checksum and the verdict.
pub fn render(compared: &[(String, Vec<String>, u64)], found: &[Difference]) -> String {
    let mut text = String::new();
    for (region, servers, blocks) in compared {
        let differing = found.iter().filter(|d| &d.region == region).count();
        let _ = writeln!(
            text,
            "region {region}: {blocks} blocks compared on copies {}: {}",
            servers.join(", "),
            if differing == 0 {
                "identical".to_owned()
            } else {
                format!("{differing} differ")
            }
        );
    }
    for d in found {
        let sums: Vec<String> = d
            .sums
            .iter()
            .map(|(server, sum)| format!("{server} {sum:#018x}"))
            .collect();
        let verdict = match &d.verdict {
            Verdict::Damaged { servers, by } => {
                format!("damaged: the copy on {} (by {by})", servers.join(", "))
            }
            Verdict::Undecided(why) => format!("undecided: {why}"),
        };
        let _ = writeln!(
            text,
            "  DIFFERS region {} block {} (offset {:#x}, {} bytes): {}; {verdict}",
            d.region,
            d.block,
            d.block * d.block_len,
            d.block_len,
            sums.join(", ")
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::RegionId;

    fn copy(server: &str, sums: &[u64]) -> CopySums {
        CopySums {
            region: RegionId::new("R"),
            server: server.into(),
            block_len: 65536,
            sums: sums.to_vec(),
        }
    }

    fn sums(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|(s, v)| ((*s).to_owned(), *v)).collect()
    }

    #[test]
    fn blocks_that_differ_on_any_copy_are_found() {
        let copies = [
            copy("A", &[1, 2, 3]),
            copy("B", &[1, 9, 3]),
            copy("C", &[1, 2, 3]),
        ];
        assert_eq!(differing(&copies), [1]);
        assert_eq!(differing(&[copy("A", &[1, 2]), copy("B", &[1])]), [1]);
        assert!(differing(&[copy("A", &[1]), copy("B", &[1])]).is_empty());
    }

    #[test]
    fn the_majority_decides_then_the_recorded_checksums_then_nothing() {
        assert_eq!(
            judge(&sums(&[("A", 1), ("B", 9), ("C", 1)]), &[]),
            Verdict::Damaged {
                servers: vec!["B".into()],
                by: "the majority of the copies"
            }
        );
        assert_eq!(
            judge(&sums(&[("A", 1), ("B", 9)]), &["A".into()]),
            Verdict::Damaged {
                servers: vec!["A".into()],
                by: "the checksum its server recorded at rest"
            }
        );
        let Verdict::Undecided(why) = judge(&sums(&[("A", 1), ("B", 9)]), &[]) else {
            panic!("two copies and nothing recorded decide nothing");
        };
        assert!(
            why.starts_with("no majority among the copies on A, B"),
            "{why}"
        );
        // Both found changed: nothing to trust.
        assert!(matches!(
            judge(&sums(&[("A", 1), ("B", 9)]), &["A".into(), "B".into()]),
            Verdict::Undecided(_)
        ));
    }

    #[test]
    fn the_report_names_region_block_copies_and_verdict() {
        let text = render(
            &[("R".into(), vec!["A".into(), "B".into()], 64)],
            &[Difference {
                region: "R".into(),
                block: 5,
                block_len: 65536,
                sums: sums(&[("A", 1), ("B", 2)]),
                verdict: Verdict::Damaged {
                    servers: vec!["B".into()],
                    by: "the checksum its server recorded at rest",
                },
            }],
        );
        assert!(
            text.starts_with("region R: 64 blocks compared on copies A, B: 1 differ\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "DIFFERS region R block 5 (offset 0x50000, 65536 bytes): A 0x0000000000000001, \
                 B 0x0000000000000002; damaged: the copy on B (by the checksum its server \
                 recorded at rest)"
            ),
            "{text}"
        );
    }
}
