//! The walk of a resync over a region's blocks: runs of blocks to compare,
//! the blocks to copy, progress, and the end — a whole pass in which every
//! block's checksum is the same on both copies.
//!
//! Writes go on to both copies while the walk runs, so a block may be
//! found different because a write reached one copy and not yet the other;
//! copying it again is harmless (the copy is ordered with the writes), and
//! the pass that copied anything is followed by another.

use std::fmt;

/// Why checksums fed to the walk are not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WalkError {
    /// The answer is not for the run the walk asked for.
    #[error(
        "checksums for blocks {first}..+{got} answer no run the resync asked for (it waits for \
         blocks {expected_first}..+{expected_len}); the answer is dropped"
    )]
    NotAsked {
        /// The first block answered.
        first: u64,
        /// How many checksums.
        got: usize,
        /// The first block of the run asked for.
        expected_first: u64,
        /// How many blocks were asked for.
        expected_len: u32,
    },
    /// The two copies do not agree on the region's size.
    #[error(
        "the deciding copy has {deciding} blocks and the syncing copy {syncing}: they are not \
         copies of one region; check the region's size in the map on both servers"
    )]
    SizeDiffers {
        /// Blocks of the deciding copy.
        deciding: u64,
        /// Blocks of the syncing copy.
        syncing: u64,
    },
}

/// What the walk has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Passes begun.
    pub passes: u32,
    /// Blocks compared in the current pass.
    pub done: u64,
    /// Blocks in the region.
    pub total: u64,
    /// Blocks compared, all passes.
    pub compared: u64,
    /// Blocks found different, all passes.
    pub differing: u64,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pass {}: {}/{} blocks compared, {} copied so far",
            self.passes, self.done, self.total, self.differing
        )
    }
}

/// The walk over one region's blocks.
#[derive(Debug, Clone)]
pub(crate) struct Walk {
    total: u64,
    run: u32,
    /// The next block to compare in this pass.
    next: u64,
    /// The run asked for and not answered yet.
    asked: Option<(u64, u32)>,
    /// A block differed in this pass.
    copied_this_pass: bool,
    finished: bool,
    progress: Progress,
}

impl Walk {
    /// A walk over `total` blocks in runs of at most `run` blocks (at
    /// least 1).
    pub(crate) fn new(total: u64, run: u32) -> Self {
        Self {
            total,
            run: run.max(1),
            next: 0,
            asked: None,
            copied_this_pass: false,
            finished: total == 0,
            progress: Progress {
                passes: 1,
                total,
                ..Progress::default()
            },
        }
    }

    /// The next run to ask both copies' checksums of, `(first, blocks)`;
    /// `None` while a run is asked for and not answered, or when the walk
    /// is finished.
    pub(crate) fn next_run(&mut self) -> Option<(u64, u32)> {
        if self.finished || self.asked.is_some() {
            return None;
        }
        if self.next == self.total {
            // A pass ended with copies: compare everything again.
            self.next = 0;
            self.copied_this_pass = false;
            self.progress.passes += 1;
            self.progress.done = 0;
        }
        let left = self.total - self.next;
        let blocks = u32::try_from(left.min(u64::from(self.run))).unwrap_or(self.run);
        self.asked = Some((self.next, blocks));
        Some((self.next, blocks))
    }

    /// Both copies' checksums of the run from block `first`: the blocks
    /// that differ, to copy from the deciding copy to the syncing one.
    pub(crate) fn compared(
        &mut self,
        first: u64,
        deciding: &[u64],
        syncing: &[u64],
    ) -> Result<Vec<u64>, WalkError> {
        let Some((asked_first, asked_len)) = self.asked else {
            return Err(WalkError::NotAsked {
                first,
                got: deciding.len(),
                expected_first: self.next,
                expected_len: 0,
            });
        };
        let answers = asked_len as usize;
        if first != asked_first || deciding.len() != answers || syncing.len() != answers {
            return Err(WalkError::NotAsked {
                first,
                got: deciding.len().min(syncing.len()),
                expected_first: asked_first,
                expected_len: asked_len,
            });
        }
        self.asked = None;
        let differ: Vec<u64> = deciding
            .iter()
            .zip(syncing)
            .enumerate()
            .filter(|(_, (d, s))| d != s)
            .map(|(i, _)| first + i as u64)
            .collect();
        self.next += u64::from(asked_len);
        self.progress.done = self.next;
        self.progress.compared += u64::from(asked_len);
        self.progress.differing += differ.len() as u64;
        self.copied_this_pass |= !differ.is_empty();
        if self.next == self.total && !self.copied_this_pass {
            self.finished = true;
        }
        Ok(differ)
    }

    /// Checks that the two copies' reports name regions of one size.
    pub(crate) fn check_totals(&self, deciding: u64, syncing: u64) -> Result<(), WalkError> {
        if deciding != self.total || syncing != self.total {
            return Err(WalkError::SizeDiffers { deciding, syncing });
        }
        Ok(())
    }

    /// The run asked for is not answered (a copy's link went down): ask
    /// for it again.
    #[cfg(test)]
    pub(crate) fn forget_asked(&mut self) {
        self.asked = None;
    }

    /// Whether a whole pass found every block equal: the copy may serve
    /// (once the copies of that pass's last blocks are done).
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// What the walk has done so far.
    pub(crate) fn progress(&self) -> Progress {
        self.progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `walk` against the blocks of two copies, copying each block
    /// that differs before the next run; the blocks copied, in order.
    fn sync(walk: &mut Walk, deciding: &[u64], syncing: &mut [u64]) -> Vec<u64> {
        let mut copied = Vec::new();
        while let Some((first, blocks)) = walk.next_run() {
            let run = first as usize..first as usize + blocks as usize;
            let differ = walk
                .compared(first, &deciding[run.clone()], &syncing[run])
                .unwrap();
            for block in differ {
                syncing[block as usize] = deciding[block as usize];
                copied.push(block);
            }
        }
        copied
    }

    #[test]
    fn only_differing_blocks_are_copied_and_a_clean_pass_ends_it() {
        let deciding: Vec<u64> = (1..=10).collect();
        let mut syncing = deciding.clone();
        syncing[2] = 99;
        syncing[7] = 0;
        let mut walk = Walk::new(10, 4);
        assert_eq!(sync(&mut walk, &deciding, &mut syncing), [2, 7]);
        assert!(walk.is_finished());
        let progress = walk.progress();
        assert_eq!(progress.passes, 2, "a second pass confirms the first");
        assert_eq!((progress.compared, progress.differing), (20, 2));
        assert_eq!((progress.done, progress.total), (10, 10));
        assert_eq!(
            progress.to_string(),
            "pass 2: 10/10 blocks compared, 2 copied so far"
        );
    }

    #[test]
    fn equal_copies_finish_in_one_pass_and_empty_regions_at_once() {
        let deciding = [5u64; 7];
        let mut syncing = deciding;
        let mut walk = Walk::new(7, 3);
        assert_eq!(walk.next_run(), Some((0, 3)));
        assert_eq!(walk.next_run(), None, "one run at a time");
        walk.forget_asked();
        assert!(sync(&mut walk, &deciding, &mut syncing).is_empty());
        assert_eq!(walk.progress().passes, 1);
        assert!(walk.is_finished());
        let mut empty = Walk::new(0, 3);
        assert!(empty.is_finished());
        assert_eq!(empty.next_run(), None);
    }

    #[test]
    fn a_block_written_during_a_pass_is_compared_again() {
        let deciding = [1u64, 2, 3, 4];
        let mut syncing = deciding;
        let mut walk = Walk::new(4, 2);
        let (first, blocks) = walk.next_run().unwrap();
        assert_eq!((first, blocks), (0, 2));
        // A write reached the deciding copy's block 1 and not yet the other.
        let differ = walk.compared(0, &[1, 20], &syncing[..2]).unwrap();
        assert_eq!(differ, [1]);
        syncing[1] = 20;
        let deciding = [1u64, 20, 3, 4];
        assert!(sync(&mut walk, &deciding, &mut syncing).is_empty());
        assert!(walk.is_finished());
        assert_eq!(walk.progress().passes, 2);
    }

    #[test]
    fn answers_for_other_runs_or_sizes_are_refused() {
        let mut walk = Walk::new(8, 4);
        assert!(matches!(
            walk.compared(0, &[1; 4], &[1; 4]),
            Err(WalkError::NotAsked { .. })
        ));
        assert_eq!(walk.next_run(), Some((0, 4)));
        let wrong = walk.compared(4, &[1; 4], &[1; 4]).unwrap_err();
        assert!(wrong.to_string().contains("blocks 0..+4"), "{wrong}");
        assert!(
            walk.compared(0, &[1; 4], &[1; 3]).is_err(),
            "a short answer"
        );
        assert_eq!(walk.compared(0, &[1; 4], &[1; 4]), Ok(vec![]));
        assert!(walk.check_totals(8, 8).is_ok());
        let size = walk.check_totals(8, 9).unwrap_err();
        assert!(size.to_string().contains("8 blocks"), "{size}");
    }
}
