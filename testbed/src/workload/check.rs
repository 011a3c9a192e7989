//! A worker's model of its keys, and how it judges the values it reads.
//!
//! Each worker owns its keys: no other worker writes them (the slices of
//! [`super::keys::KeySpace`] do not overlap). A write holds its key until it
//! is answered, so two writes of one key never overlap. Reads hold nothing,
//! and a worker has several requests in flight at once, so a read may
//! overlap a write of its key. The server's contract allows such a read to
//! see a mix of the old and the new bytes, as one-sided RDMA does.
//!
//! So the model numbers the writes of each key, and a read notes, when it
//! is sent, whether a write of its key is in flight and how many have
//! started. When it returns, it overlapped a write if one was in flight
//! then or one started since. A torn value is corruption only when no write
//! overlapped the read; a whole value must be a version that was written,
//! overlapped or not.

use std::collections::{HashMap, HashSet};

use super::keys::Seen;

/// What the worker knows about one key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// Last acknowledged version (0: none).
    pub acked: u64,
    /// Versions written after it without an acknowledgement.
    pub unacked: Vec<u64>,
    /// Versions started so far (the highest ever sent).
    pub started: u64,
}

/// The writes of a worker's keys: versions, acknowledgements, and which
/// keys are being written now.
#[derive(Debug, Default)]
pub struct KeyModel {
    keys: HashMap<u64, KeyState>,
    writing: HashSet<u64>,
}

/// A read on its way: what the model said when it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRead {
    key: u64,
    /// Writes of the key started when the read was sent.
    started: u64,
    /// A write of the key was in flight when the read was sent.
    writing: bool,
}

/// How a read's value compares with the writes of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadVerdict {
    /// No write of the key overlapped the read, and it saw a version that
    /// was written (or nothing, on a key never written).
    Clean,
    /// A write of the key overlapped the read. A whole value it saw was a
    /// version that was written; `torn` when it saw a mix of versions,
    /// which the contract allows.
    Overlapped {
        /// The value was a mix of versions.
        torn: bool,
    },
    /// The read saw something no write explains; the line says what.
    Wrong(String),
}

impl KeyModel {
    /// Starts a write of `key` unless one is in flight: the new version,
    /// which the write must carry.
    pub fn begin_write(&mut self, key: u64) -> Option<u64> {
        if !self.writing.insert(key) {
            return None;
        }
        let state = self.keys.entry(key).or_default();
        state.started += 1;
        Some(state.started)
    }

    /// Ends the write of `version` of `key`: acknowledged (`ok`) or failed
    /// (it may still have been applied).
    pub fn end_write(&mut self, key: u64, version: u64, ok: bool) {
        let state = self.keys.entry(key).or_default();
        if ok {
            state.acked = version;
            state.unacked.clear();
        } else {
            state.unacked.push(version);
        }
        self.writing.remove(&key);
    }

    /// Notes a read of `key` about to be sent.
    pub fn begin_read(&self, key: u64) -> PendingRead {
        PendingRead {
            key,
            started: self.started(key),
            writing: self.writing.contains(&key),
        }
    }

    /// Judges what the read `read` saw, now that it returned.
    pub fn end_read(&self, read: PendingRead, seen: Seen) -> ReadVerdict {
        let key = read.key;
        let started = self.started(key);
        let overlapped = read.writing || started != read.started;
        let judged = |torn| {
            if overlapped {
                ReadVerdict::Overlapped { torn }
            } else {
                ReadVerdict::Clean
            }
        };
        match seen {
            Seen::Empty => judged(false),
            Seen::Version(v) if (1..=started).contains(&v) => judged(false),
            Seen::Version(v) => ReadVerdict::Wrong(format!(
                "read of key {key} during the run saw version {v}, but versions 1 to \
                 {started} were the only ones written"
            )),
            Seen::Garbage if overlapped => ReadVerdict::Overlapped { torn: true },
            Seen::Garbage => ReadVerdict::Wrong(format!(
                "read of key {key} during the run saw bytes no write of it produced, and no \
                 write of it overlapped the read"
            )),
        }
    }

    /// Every key written so far, with its state.
    pub fn written(&self) -> impl Iterator<Item = (u64, &KeyState)> {
        self.keys
            .iter()
            .filter(|(_, s)| s.acked != 0 || !s.unacked.is_empty())
            .map(|(k, s)| (*k, s))
    }

    fn started(&self, key: u64) -> u64 {
        self.keys.get(&key).map_or(0, |s| s.started)
    }
}

/// What is wrong with `seen`, read back from key `key` after the run
/// (every write answered): `None` when it holds its last acknowledged
/// version or a later unacknowledged one.
pub fn final_problem(key: u64, state: &KeyState, seen: Seen) -> Option<String> {
    match seen {
        Seen::Version(v) if v == state.acked || state.unacked.contains(&v) => None,
        Seen::Empty if state.acked == 0 => None,
        seen => Some(format!(
            "key {key}: acknowledged version {} but found {seen:?}",
            state.acked
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::keys::{decode, value};

    const SIZE: usize = 256;

    /// Key `key` with version `new`'s first 64 bytes and `old`'s rest, as
    /// a read racing the write of `new` may see it.
    fn torn(key: u64, old: u64, new: u64) -> Seen {
        let mut bytes = value(key, old, SIZE);
        bytes[..64].copy_from_slice(&value(key, new, SIZE)[..64]);
        decode(key, &bytes)
    }

    /// A model where key 905 has version 1 acknowledged.
    fn written_once() -> KeyModel {
        let mut model = KeyModel::default();
        let v = model.begin_write(905).expect("key free");
        model.end_write(905, v, true);
        model
    }

    #[test]
    fn a_torn_read_overlapping_a_write_of_its_key_is_not_corruption() {
        assert_eq!(torn(905, 1, 2), Seen::Garbage);
        // The write started after the read was sent and was answered
        // before the read returned.
        let mut model = written_once();
        let read = model.begin_read(905);
        let v = model.begin_write(905).expect("key free");
        model.end_write(905, v, true);
        assert_eq!(
            model.end_read(read, torn(905, 1, 2)),
            ReadVerdict::Overlapped { torn: true }
        );
        // The write was in flight when the read was sent.
        let v = model.begin_write(905).expect("key free");
        let read = model.begin_read(905);
        model.end_write(905, v, true);
        assert_eq!(
            model.end_read(read, torn(905, 2, 3)),
            ReadVerdict::Overlapped { torn: true }
        );
        // Still in flight when it returned.
        let v = model.begin_write(905).expect("key free");
        let read = model.begin_read(905);
        assert_eq!(
            model.end_read(read, torn(905, 3, 4)),
            ReadVerdict::Overlapped { torn: true }
        );
        model.end_write(905, v, false);
    }

    #[test]
    fn a_torn_read_with_no_overlapping_write_is_corruption() {
        let mut model = written_once();
        let v = model.begin_write(905).expect("key free");
        model.end_write(905, v, true);
        // Both writes were answered before the read was sent.
        let read = model.begin_read(905);
        let ReadVerdict::Wrong(line) = model.end_read(read, torn(905, 1, 2)) else {
            panic!("a torn value with no write overlapping passed");
        };
        assert!(
            line.contains("key 905") && line.contains("no write"),
            "{line}"
        );
        // A write of another key overlapping changes nothing.
        let read = model.begin_read(905);
        let other = model.begin_write(906).expect("key free");
        model.end_write(906, other, true);
        assert!(matches!(
            model.end_read(read, torn(905, 1, 2)),
            ReadVerdict::Wrong(_)
        ));
    }

    #[test]
    fn a_whole_value_must_be_a_version_that_was_written_overlapped_or_not() {
        let mut model = written_once();
        let read = model.begin_read(905);
        assert_eq!(model.end_read(read, Seen::Version(1)), ReadVerdict::Clean);
        assert!(matches!(
            model.end_read(read, Seen::Version(2)),
            ReadVerdict::Wrong(_)
        ));
        let v = model.begin_write(905).expect("key free");
        assert_eq!(v, 2);
        assert_eq!(
            model.end_read(read, Seen::Version(2)),
            ReadVerdict::Overlapped { torn: false }
        );
        let ReadVerdict::Wrong(line) = model.end_read(read, Seen::Version(3)) else {
            panic!("version 3 was never written");
        };
        assert!(line.contains("version 3"), "{line}");
        assert_eq!(
            model.end_read(model.begin_read(7), Seen::Empty),
            ReadVerdict::Clean
        );
    }

    #[test]
    fn a_key_is_written_by_one_write_at_a_time() {
        let mut model = KeyModel::default();
        assert_eq!(model.begin_write(1), Some(1));
        assert_eq!(model.begin_write(1), None);
        assert_eq!(model.begin_write(2), Some(1));
        model.end_write(1, 1, false);
        assert_eq!(model.begin_write(1), Some(2));
        model.end_write(1, 2, true);
        let state = model.written().find(|(k, _)| *k == 1).expect("key 1").1;
        assert_eq!((state.acked, state.unacked.as_slice()), (2, &[][..]));
    }

    #[test]
    fn the_final_check_wants_the_last_acknowledged_version_or_a_later_one() {
        let state = KeyState {
            acked: 3,
            unacked: vec![4],
            started: 4,
        };
        assert_eq!(final_problem(1, &state, Seen::Version(3)), None);
        assert_eq!(final_problem(1, &state, Seen::Version(4)), None);
        assert!(final_problem(1, &state, Seen::Version(2)).is_some());
        assert!(final_problem(1, &state, Seen::Garbage).is_some());
        assert!(final_problem(1, &state, Seen::Empty).is_some());
    }
}
