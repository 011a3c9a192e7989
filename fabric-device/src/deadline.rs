//! Request deadlines, kept in the order they were set.
//!
//! Every forwarded request gets the same timeout, and `now` never goes
//! backwards, so deadlines are set in ascending order: a FIFO holds them
//! sorted with an O(1) push, where an ordered set paid a tree insert and a
//! tree remove per request. A request answered in time is not looked for in
//! the queue; its entry goes stale and is dropped when it reaches the front
//! (the caller says which entries are still live). Stale entries behind a
//! live one at the front — a request that stays unanswered while later ones
//! are answered — are swept out whenever the queue has doubled since the
//! last sweep, so memory stays within about twice the live entries and the
//! sweeps cost O(1) per request, amortised.

use std::collections::VecDeque;
use std::time::Instant;

use crate::ids::LinkId;

/// Fewest entries a queue may hold before it sweeps out stale ones.
const SWEEP_MIN: usize = 1024;

/// One request's deadline: the link it was forwarded on and its tag there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// When the request times out.
    pub at: Instant,
    /// The link it waits on.
    pub link: LinkId,
    /// Its tag on that link.
    pub tag: u64,
}

/// Deadlines in ascending order, stale entries dropped lazily.
#[derive(Debug)]
pub struct DeadlineQueue {
    entries: VecDeque<Deadline>,
    /// Length at which the next sweep runs.
    sweep_at: usize,
}

impl Default for DeadlineQueue {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            sweep_at: SWEEP_MIN,
        }
    }
}

impl DeadlineQueue {
    /// Adds a deadline. One earlier than the last one added (a clock that
    /// went backwards, or a shorter timeout) is moved up to it, so the queue
    /// stays sorted; the request then times out that much later.
    ///
    /// `live` tells whether an entry is still waited for; it is used to
    /// sweep stale entries when the queue has grown.
    pub fn push(&mut self, mut deadline: Deadline, live: impl FnMut(&Deadline) -> bool) {
        if let Some(last) = self.entries.back() {
            deadline.at = deadline.at.max(last.at);
        }
        self.entries.push_back(deadline);
        if self.entries.len() >= self.sweep_at {
            self.entries.retain(live);
            self.sweep_at = (2 * self.entries.len()).max(SWEEP_MIN);
        }
    }

    /// The earliest deadline held (possibly a stale one: waking up early is
    /// harmless), if any.
    pub fn first(&self) -> Option<Instant> {
        self.entries.front().map(|d| d.at)
    }

    /// Drops stale entries from the front, so [`first`](Self::first) is a
    /// live deadline again.
    pub fn trim(&mut self, mut live: impl FnMut(&Deadline) -> bool) {
        while let Some(front) = self.entries.front() {
            if live(front) {
                return;
            }
            self.entries.pop_front();
        }
    }

    /// Removes and returns the front entry if it is due at `now` (live or
    /// not: the caller checks).
    pub fn pop_due(&mut self, now: Instant) -> Option<Deadline> {
        if self.entries.front()?.at > now {
            return None;
        }
        self.entries.pop_front()
    }

    /// Entries held, stale ones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;

    fn at(start: Instant, ms: u64, tag: u64) -> Deadline {
        Deadline {
            at: start + Duration::from_millis(ms),
            link: LinkId(0),
            tag,
        }
    }

    #[test]
    fn due_entries_come_out_in_order() {
        let start = Instant::now();
        let mut q = DeadlineQueue::default();
        for tag in 0..3 {
            q.push(at(start, 10 * tag, tag), |_| true);
        }
        assert_eq!(q.first(), Some(start));
        assert_eq!(
            q.pop_due(start + Duration::from_millis(15)),
            Some(at(start, 0, 0))
        );
        assert_eq!(
            q.pop_due(start + Duration::from_millis(15)),
            Some(at(start, 10, 1))
        );
        assert_eq!(q.pop_due(start + Duration::from_millis(15)), None);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn an_earlier_deadline_is_moved_up_to_keep_the_order() {
        let start = Instant::now();
        let mut q = DeadlineQueue::default();
        q.push(at(start, 50, 1), |_| true);
        q.push(at(start, 20, 2), |_| true);
        assert_eq!(q.pop_due(start + Duration::from_millis(20)), None);
        let due = start + Duration::from_millis(50);
        assert_eq!(q.pop_due(due).map(|d| d.tag), Some(1));
        assert_eq!(q.pop_due(due), Some(at(start, 50, 2)));
    }

    #[test]
    fn trim_drops_stale_entries_up_to_the_first_live_one() {
        let start = Instant::now();
        let mut q = DeadlineQueue::default();
        for tag in 0..5 {
            q.push(at(start, tag, tag), |_| true);
        }
        let live: HashSet<u64> = [2, 4].into();
        q.trim(|d| live.contains(&d.tag));
        assert_eq!(q.first(), Some(start + Duration::from_millis(2)));
        assert_eq!(q.len(), 3);
        q.trim(|_| false);
        assert!(q.is_empty());
        assert_eq!(q.first(), None);
    }

    #[test]
    fn one_stuck_entry_does_not_make_the_queue_grow_without_bound() {
        let start = Instant::now();
        let mut q = DeadlineQueue::default();
        // Tag 0 is never answered; every later request is answered right
        // after it is sent.
        let mut live: HashSet<u64> = [0].into();
        q.push(at(start, 0, 0), |d| live.contains(&d.tag));
        for tag in 1..100_000u64 {
            live.insert(tag);
            q.push(at(start, 1, tag), |d| live.contains(&d.tag));
            live.remove(&tag);
            q.trim(|d| live.contains(&d.tag));
            assert!(q.len() <= 2 * SWEEP_MIN, "{} entries", q.len());
        }
        assert_eq!(q.first(), Some(start));
    }
}
