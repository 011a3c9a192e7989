//! Which regions the allocator takes extents from, as the pool's layout
//! changes under it: a region is a candidate once its header is formatted
//! and while the current layout holds it. A region new in the layout is
//! formatted by the first allocator that sees it (the state word protocol
//! of [`topology::region_header`]); a region the layout withdrew gets no new
//! allocations (reads of the old ones fail as its server answers).
//!
//! Regions are known by their PMEM start address, which never changes
//! across layouts, not by their index.

use std::collections::BTreeSet;
use std::sync::Arc;

use topology::region_header::{self, RegionState, word};
use topology::{Layout, MetaLayout, PmemAddr, RegionId, RegionMeta};

use super::{AllocError, Allocator, records, region_header_image, unix_now};

/// Seconds a formatting claim is honoured; an older one is taken over (its
/// claimant crashed or stalled; formatting again is harmless since nothing
/// was allocated from the region yet).
pub const CLAIM_TIMEOUT_SECS: u64 = 30;

/// Tries at one region's state word before leaving it for a later refresh.
const STATE_TRIES: u32 = 4;

/// What a refresh did with the regions of the current layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Growth {
    /// Regions whose header this allocator formatted.
    pub formatted: Vec<RegionId>,
    /// Regions found formatted (by the pool's format or another client).
    pub joined: Vec<RegionId>,
    /// Regions another client is formatting now (retried on the next refresh).
    pub waiting: Vec<RegionId>,
    /// Regions that were candidates and that the layout no longer holds.
    pub withdrawn: Vec<RegionId>,
}

/// The candidates, as last worked out.
#[derive(Debug, Default)]
pub(super) struct Candidates {
    /// The layout they were worked out against.
    seen: Option<Arc<Layout>>,
    /// Start addresses of formatted regions that layout holds.
    usable: BTreeSet<u64>,
    /// Start addresses of regions that layout holds, not formatted yet.
    pending: BTreeSet<u64>,
}

/// What to do with a region header whose state word reads `word`, at unix
/// second `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Formatted: check its identity and allocate from it.
    Join,
    /// Claim it (COMPARE_SWAP from the word read) and format it.
    Claim,
    /// Another claim is young: leave it to its claimant for now.
    Wait,
}

/// The step for state word `word` at unix second `now`: a claim younger
/// than [`CLAIM_TIMEOUT_SECS`] is waited for; an older one, or one dated in
/// the future by more than that (garbage or a wild clock), is taken over.
pub(super) fn step(word: u64, now: u64) -> Step {
    match RegionState::decode(word) {
        RegionState::Formatted => Step::Join,
        RegionState::Unformatted => Step::Claim,
        RegionState::Formatting { since, .. } => {
            let since = u64::from(since);
            let age = now.abs_diff(since);
            if age < CLAIM_TIMEOUT_SECS {
                Step::Wait
            } else {
                Step::Claim
            }
        }
    }
}

/// What became of one region.
enum Settled {
    Formatted,
    Joined,
    Waiting,
}

impl Candidates {
    /// The candidates once the pool's format wrote every header of `layout`.
    pub(super) fn all_of(layout: Arc<Layout>) -> Self {
        let usable = layout.entries().iter().map(|e| e.start.get()).collect();
        Self {
            seen: Some(layout),
            usable,
            pending: BTreeSet::new(),
        }
    }

    /// Whether the region starting at `start` may be allocated from.
    pub(super) fn is_usable(&self, start: PmemAddr) -> bool {
        self.usable.contains(&start.get())
    }
}

impl Allocator {
    /// Takes up the pool's current layout: regions new in it are formatted
    /// (or found formatted by another client) and join the candidates,
    /// withdrawn ones leave them, and regions another client was formatting
    /// are looked at again. Allocation does this by itself when the layout
    /// has changed and when it runs out of room; this is for a caller that
    /// wants it now.
    pub async fn refresh(&self) -> Result<Growth, AllocError> {
        self.follow_layout(true).await
    }

    /// [`Self::refresh`] when the layout changed since the last one, or
    /// when `retry_pending` and some region was left to another client.
    pub(super) async fn follow_layout(&self, retry_pending: bool) -> Result<Growth, AllocError> {
        let layout = self.pool.layout();
        let (changed, pending) = {
            let c = self.lock_candidates();
            let changed = !c.seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, &layout));
            (changed, !c.pending.is_empty())
        };
        let wanted = changed || (retry_pending && pending);
        if !wanted {
            return Ok(Growth::default());
        }
        let Some(meta) = layout.meta() else {
            return Err(AllocError::NoAllocator {
                pool: self.pool_name(),
            });
        };
        if changed {
            self.check_geometry(meta)?;
        }
        let (old_usable, old_pending) = {
            let c = self.lock_candidates();
            (c.usable.clone(), c.pending.clone())
        };
        let mut growth = Growth::default();
        let mut usable = BTreeSet::new();
        let mut waiting = BTreeSet::new();
        for entry in layout.entries() {
            let start = entry.start.get();
            if old_usable.contains(&start) {
                usable.insert(start);
                continue;
            }
            if !changed && !old_pending.contains(&start) {
                continue;
            }
            let Some(region) = meta.region(entry.region) else {
                continue;
            };
            let id = entry.region_id.clone();
            match self.settle(region).await? {
                Settled::Formatted => {
                    usable.insert(start);
                    growth.formatted.push(id);
                }
                Settled::Joined => {
                    usable.insert(start);
                    growth.joined.push(id);
                }
                Settled::Waiting => {
                    waiting.insert(start);
                    growth.waiting.push(id);
                }
            }
        }
        if let Some(seen) = &self.lock_candidates().seen {
            growth.withdrawn = seen
                .entries()
                .iter()
                .filter(|e| old_usable.contains(&e.start.get()) && !usable.contains(&e.start.get()))
                .map(|e| e.region_id.clone())
                .collect();
        }
        let mut c = self.lock_candidates();
        *c = Candidates {
            seen: Some(layout),
            usable,
            pending: waiting,
        };
        Ok(growth)
    }

    /// Reads `region`'s state word and takes the step it calls for,
    /// formatting the header when this client wins the claim.
    async fn settle(&self, region: &RegionMeta) -> Result<Settled, AllocError> {
        let state_at = region.at(word::STATE);
        for _ in 0..STATE_TRIES {
            let head = self
                .read(region.start, region.key, word::FIXED_LEN as u32)
                .await?;
            let found = records::word_at(&head, word::STATE as usize).unwrap_or_default();
            match step(found, unix_now()) {
                Step::Join => {
                    self.check_identity(region, &head)?;
                    return Ok(Settled::Joined);
                }
                Step::Wait => return Ok(Settled::Waiting),
                Step::Claim => {}
            }
            let mine = RegionState::claim(self.owner, unix_now()).encode();
            if self.cas(state_at, region.key, found, mine).await? != found {
                continue;
            }
            let image = region_header_image(region, RegionState::Formatted);
            let (fixed, rest) = (word::STATE as usize, word::STATE as usize + 8);
            self.write(region.start, region.key, &image[..fixed])
                .await?;
            self.write(region.at(rest as u64), region.key, &image[rest..])
                .await?;
            let done = region_header::FORMATTED;
            if self.cas(state_at, region.key, mine, done).await? == mine {
                self.lock_guesses().bitmaps.remove(&region.region);
                return Ok(Settled::Formatted);
            }
            // Taken over while this client was slow: look again.
        }
        Ok(Settled::Waiting)
    }

    /// A formatted header describes `region` as the layout places it.
    fn check_identity(&self, region: &RegionMeta, head: &[u8]) -> Result<(), AllocError> {
        let at = |offset: u64| records::word_at(head, offset as usize).unwrap_or_default();
        let recorded = (at(word::MAGIC), at(word::START), at(word::EXTENTS));
        let expected = (records::REGION_MAGIC, region.start.get(), region.extents);
        if recorded == expected {
            return Ok(());
        }
        Err(AllocError::FormatMismatch {
            pool: self.pool_name(),
            what: format!(
                "the header of region index {} at {} records {} extents from {:#x} (magic {:#x}), \
                 the layout says {} extents from {}; a layout must never move or resize a region",
                region.region.0,
                region.start,
                recorded.2,
                recorded.1,
                recorded.0,
                region.extents,
                region.start
            ),
        })
    }

    /// `meta` (a new layout's metadata) keeps the geometry this allocator
    /// checked against the superblock.
    fn check_geometry(&self, meta: &MetaLayout) -> Result<(), AllocError> {
        match geometry_differences(&self.meta, meta).first() {
            Some(&(what, found, formatted)) => Err(AllocError::FormatMismatch {
                pool: self.pool_name(),
                what: geometry_advice(what, formatted, found),
            }),
            None => Ok(()),
        }
    }

    /// Regions the allocator may take extents from now, of the current layout.
    pub(super) fn usable_regions(&self) -> Vec<RegionMeta> {
        let layout = self.pool.layout();
        let c = self.lock_candidates();
        layout
            .meta()
            .map(|m| {
                m.regions()
                    .iter()
                    .filter(|r| c.is_usable(r.start))
                    .copied()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn lock_candidates(&self) -> std::sync::MutexGuard<'_, Candidates> {
        self.candidates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The metadata geometry that must not change once formatted, as
/// (what, value) pairs.
pub(super) fn geometry(meta: &MetaLayout) -> [(&'static str, u64); 5] {
    [
        ("extent size", meta.extent_size()),
        ("page-table entries", meta.page_table_entries()),
        ("name entries", meta.names()),
        ("metadata region start", meta.meta_region().start.get()),
        ("metadata extents", meta.meta_region().reserved),
    ]
}

/// Where `now` differs from `formatted`: (what, now's value, formatted value).
fn geometry_differences(formatted: &MetaLayout, now: &MetaLayout) -> Vec<(&'static str, u64, u64)> {
    geometry(formatted)
        .into_iter()
        .zip(geometry(now))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((what, a), (_, b))| (what, b, a))
        .collect()
}

/// What differs and what to do about it.
pub(super) fn geometry_advice(what: &str, formatted: u64, found: u64) -> String {
    let fix = match what {
        "page-table entries" => format!(
            "; the page table's size is fixed at format: set page_table_entries = {formatted} \
             in [pool.allocator] (the default follows the pool's extents, so it changes as the pool grows)"
        ),
        "name entries" => format!("; set names = {formatted} in [pool.allocator]"),
        "metadata extents" => {
            "; the metadata's size is fixed at format: keep page_table_entries and names as they were"
                .to_owned()
        }
        _ => String::new(),
    };
    format!("{what} {formatted} at format, this topology gives {found}{fix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn claim_at(since: u64) -> u64 {
        RegionState::claim(3, since).encode()
    }

    #[test]
    fn an_unformatted_header_is_claimed_and_a_formatted_one_joined() {
        assert_eq!(step(0, NOW), Step::Claim);
        assert_eq!(step(0xdead_beef, NOW), Step::Claim);
        assert_eq!(step(records::REGION_MAGIC, NOW), Step::Claim);
        assert_eq!(step(region_header::FORMATTED, NOW), Step::Join);
    }

    #[test]
    fn a_young_claim_is_waited_for_and_a_stale_one_taken_over() {
        assert_eq!(step(claim_at(NOW), NOW), Step::Wait);
        assert_eq!(
            step(claim_at(NOW - CLAIM_TIMEOUT_SECS + 1), NOW),
            Step::Wait
        );
        assert_eq!(step(claim_at(NOW - CLAIM_TIMEOUT_SECS), NOW), Step::Claim);
        assert_eq!(step(claim_at(0), NOW), Step::Claim);
        // A claim dated far ahead is garbage or a wild clock, not a live one.
        assert_eq!(step(claim_at(NOW + CLAIM_TIMEOUT_SECS), NOW), Step::Claim);
        assert_eq!(step(claim_at(NOW + 1), NOW), Step::Wait);
    }

    /// The whole protocol on one in-memory word, with COMPARE_SWAP as the
    /// only write: two clients racing, one crashing mid-format.
    #[test]
    fn one_claim_wins_and_a_crashed_claim_is_taken_over_once_stale() {
        fn cas(word: &mut u64, old: u64, new: u64) -> bool {
            let won = *word == old;
            if won {
                *word = new;
            }
            won
        }
        let mut state = 0u64;
        // Both read 0; only the first COMPARE_SWAP wins.
        let (seen_a, seen_b) = (state, state);
        assert_eq!(step(seen_a, NOW), Step::Claim);
        assert_eq!(step(seen_b, NOW), Step::Claim);
        let (a, b) = (
            RegionState::claim(1, NOW).encode(),
            RegionState::claim(2, NOW).encode(),
        );
        assert!(cas(&mut state, seen_a, a));
        assert!(!cas(&mut state, seen_b, b));
        // B looks again and waits for A's young claim.
        assert_eq!(step(state, NOW + 1), Step::Wait);
        // A crashes here. Once the claim is stale, B takes it over...
        let later = NOW + CLAIM_TIMEOUT_SECS;
        assert_eq!(step(state, later), Step::Claim);
        let b = RegionState::claim(2, later).encode();
        assert!(cas(&mut state, a, b));
        // ...and A, were it only slow, can no longer mark it formatted.
        assert!(!cas(&mut state, a, region_header::FORMATTED));
        assert!(cas(&mut state, b, region_header::FORMATTED));
        assert_eq!(step(state, later), Step::Join);
    }

    #[test]
    fn a_page_table_of_another_size_names_the_setting_to_keep() {
        let advice = geometry_advice("page-table entries", 256, 512);
        assert!(
            advice.contains("page-table entries 256 at format"),
            "{advice}"
        );
        assert!(
            advice.contains("set page_table_entries = 256 in [pool.allocator]"),
            "{advice}"
        );
    }
}
