//! Which exactly-once requests are too old to answer, per client session.
//!
//! A client process numbers its exactly-once requests in a session of its
//! own: the upper 32 bits of a sequence number are the session (random per
//! process), the lower 32 count within it. Several processes may share one
//! exactly-once identity (a restarted process, workers of one application),
//! so sequence numbers of one identity are ordered only within a session.
//! When a result leaves an identity's window, its session's *mark* rises to
//! cover it: any request of that session at or below the mark, and not in
//! the window, is stale (it may have run; its result is gone).
//!
//! An identity keeps the marks of the [`MARKS`] sessions that evicted most
//! recently. A session whose mark was dropped for a newer one loses only
//! that safety net: a retry so late that [`WINDOW`](super::record::WINDOW)
//! newer results of its identity arrived first would run again.
//!
//! A mark is one 8-byte word, 1 + the highest evicted sequence number (0:
//! no mark), so it reaches the media whole.

use std::collections::VecDeque;

/// Marks kept per identity.
pub const MARKS: usize = 64;

/// The session of a sequence number.
pub fn session_of(seq: u64) -> u32 {
    (seq >> 32) as u32
}

/// The stale marks of one identity, in a fixed array of [`MARKS`] words
/// (the layout the window file keeps) with their recency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleMarks {
    /// 1 + the highest evicted sequence number of a session; 0: free.
    words: Vec<u64>,
    /// Indices of used words, least recently raised first.
    recency: VecDeque<usize>,
}

impl Default for StaleMarks {
    fn default() -> Self {
        Self::from_words(vec![0; MARKS])
    }
}

/// A mark that changed: the word at `index` is now `word`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaisedMark {
    /// Its place in the array.
    pub index: usize,
    /// Its new value (1 + the highest evicted sequence number).
    pub word: u64,
}

impl StaleMarks {
    /// Marks as stored: `words[i]` is 1 + a session's highest evicted
    /// sequence number, 0 for a free place. Extra words are ignored.
    pub fn from_words(mut words: Vec<u64>) -> Self {
        words.resize(MARKS, 0);
        let recency = (0..MARKS).filter(|&i| words[i] != 0).collect();
        Self { words, recency }
    }

    fn index_of(&self, session: u32) -> Option<usize> {
        self.recency
            .iter()
            .copied()
            .find(|&i| session_of(self.words[i] - 1) == session)
    }

    /// Whether `seq` is at or below its session's mark.
    pub fn is_stale(&self, seq: u64) -> bool {
        self.index_of(session_of(seq))
            .is_some_and(|i| seq < self.words[i])
    }

    /// Raises the mark of `seq`'s session to cover `seq` (which just left
    /// the window), taking a free place or the least recently raised one.
    /// Returns the word to store, if it changed.
    pub fn raise(&mut self, seq: u64) -> Option<RaisedMark> {
        let word = seq.checked_add(1)?;
        let index = match self.index_of(session_of(seq)) {
            Some(i) if self.words[i] >= word => return None,
            Some(i) => {
                self.recency.retain(|&r| r != i);
                i
            }
            None => match self.words.iter().position(|&w| w == 0) {
                Some(free) => free,
                None => self.recency.pop_front()?,
            },
        };
        self.words[index] = word;
        self.recency.push_back(index);
        Some(RaisedMark { index, word })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(session: u32, counter: u32) -> u64 {
        u64::from(session) << 32 | u64::from(counter)
    }

    #[test]
    fn sessions_are_stale_only_below_their_own_mark() {
        let mut marks = StaleMarks::default();
        assert_eq!(
            marks.raise(seq(7, 100)),
            Some(RaisedMark {
                index: 0,
                word: seq(7, 100) + 1
            })
        );
        assert!(marks.is_stale(seq(7, 100)));
        assert!(marks.is_stale(seq(7, 3)));
        assert!(!marks.is_stale(seq(7, 101)));
        // Another process with the same identity: its own numbering.
        assert!(!marks.is_stale(seq(2, 5)));
        assert!(!marks.is_stale(seq(8, 0)));
        assert_eq!(marks.raise(seq(7, 50)), None, "marks never fall");
        assert_eq!(marks.raise(seq(2, 5)).map(|m| m.index), Some(1));
        assert!(marks.is_stale(seq(2, 5)) && marks.is_stale(seq(7, 100)));
    }

    #[test]
    fn the_least_recently_raised_mark_makes_room_and_words_reload() {
        let mut marks = StaleMarks::default();
        for session in 0..MARKS as u32 {
            marks.raise(seq(session, 10));
        }
        marks.raise(seq(0, 11));
        let raised = marks.raise(seq(1000, 1)).expect("a place");
        assert_eq!(raised.index, 1, "session 1 was raised least recently");
        assert!(!marks.is_stale(seq(1, 10)), "its mark is gone");
        assert!(marks.is_stale(seq(0, 11)) && marks.is_stale(seq(1000, 1)));
        let reloaded = StaleMarks::from_words(marks.words.clone());
        for s in [seq(0, 11), seq(1000, 1), seq(63, 10)] {
            assert!(reloaded.is_stale(s));
        }
        assert!(!reloaded.is_stale(seq(63, 11)));
    }

    #[test]
    fn the_reserved_sequence_number_raises_nothing() {
        let mut marks = StaleMarks::default();
        assert_eq!(marks.raise(u64::MAX), None);
        assert!(!marks.is_stale(u64::MAX - 1));
    }
}
