//! The recorded history of a register workload: one JSON line per
//! operation on a hot word, with the process that issued it, when it was
//! invoked and when it completed (nanoseconds of the machine's monotonic
//! clock, which every process on one kernel shares), and what it returned
//! — or that the client never learned its outcome.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How a history file's name ends: `<client>.history.jsonl`.
pub const HISTORY_SUFFIX: &str = ".history.jsonl";

/// An operation on one 8-byte word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WordOp {
    /// READ of the word's 8 bytes.
    Read,
    /// Store of a value (sent as ATOMIC_WRITE).
    Write(u64),
    /// COMPARE_SWAP: store `new` if the word holds `expected`.
    CompareSwap {
        /// The value the word must hold.
        expected: u64,
        /// The value stored when it does.
        new: u64,
    },
    /// FETCH_ADD of a wrapping delta.
    FetchAdd(u64),
}

/// What an operation on a word returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WordRet {
    /// The value a READ saw.
    Read(u64),
    /// A store was acknowledged.
    Write,
    /// The value COMPARE_SWAP found (it swapped when that was `expected`).
    CompareSwap(u64),
    /// The value FETCH_ADD found before adding.
    FetchAdd(u64),
}

/// How an operation ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It completed and returned this.
    Ok(WordRet),
    /// It failed or timed out: it may have taken effect, at any point after
    /// its invocation, or never. The text says why the client gave up.
    Unknown(String),
}

/// One operation of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The client that issued it.
    pub client: String,
    /// The sequential process that issued it, unique in the run. A process
    /// has one operation in flight at a time and issues nothing after an
    /// operation of unknown outcome (its client goes on as a new process).
    pub process: u64,
    /// Which hot word.
    pub word: u64,
    /// What it asked.
    pub op: WordOp,
    /// When it was sent (monotonic nanoseconds).
    pub invoked_ns: u64,
    /// When its answer or failure came back (monotonic nanoseconds).
    pub completed_ns: u64,
    /// What came back.
    pub outcome: Outcome,
}

/// Reading or writing a history failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A file could not be opened, read or written.
    #[error("{path}: cannot {what}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A line is not an operation of this format.
    #[error("{path}:{line}: not a history entry (expected one JSON object per line)")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A folder holds no history file.
    #[error(
        "{0}: no *{HISTORY_SUFFIX} file here or in workers/; give the run folder of a \
         `--workload register` run"
    )]
    NoHistory(PathBuf),
}

/// Now on the machine's monotonic clock, in nanoseconds: comparable between
/// processes on one kernel (not between a host and its guests).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer we give,
    // which points at a live, writable local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return 0;
    }
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Appends entries to a history file, one JSON line each.
#[derive(Debug)]
pub struct HistoryWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl HistoryWriter {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, HistoryError> {
        let file = File::create(path).map_err(|source| HistoryError::Io {
            path: path.to_owned(),
            what: "create the history file",
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            out: BufWriter::new(file),
        })
    }

    /// Appends one entry.
    pub fn append(&mut self, entry: &Entry) -> Result<(), HistoryError> {
        let io = |source| HistoryError::Io {
            path: self.path.clone(),
            what: "write the history",
            source,
        };
        serde_json::to_writer(&mut self.out, entry).map_err(|e| io(e.into()))?;
        self.out.write_all(b"\n").map_err(io)
    }

    /// Writes out what is buffered.
    pub fn finish(mut self) -> Result<(), HistoryError> {
        self.out.flush().map_err(|source| HistoryError::Io {
            path: self.path.clone(),
            what: "write the history",
            source,
        })
    }
}

/// Every entry of one history file.
pub fn read_file(path: &Path) -> Result<Vec<Entry>, HistoryError> {
    let file = File::open(path).map_err(|source| HistoryError::Io {
        path: path.to_owned(),
        what: "open the history file",
        source,
    })?;
    let mut entries = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| HistoryError::Io {
            path: path.to_owned(),
            what: "read the history file",
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let entry = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// The history files of a run: `*.history.jsonl` in `dir`, or in
/// `dir/workers/` (a run's folder), sorted by name.
pub fn files_in(dir: &Path) -> Result<Vec<PathBuf>, HistoryError> {
    for folder in [dir.to_owned(), dir.join("workers")] {
        let Ok(listing) = std::fs::read_dir(&folder) else {
            continue;
        };
        let mut files: Vec<PathBuf> = listing
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(HISTORY_SUFFIX))
            })
            .collect();
        if !files.is_empty() {
            files.sort();
            return Ok(files);
        }
    }
    Err(HistoryError::NoHistory(dir.to_owned()))
}

/// Every entry of every history file of a run (see [`files_in`]).
pub fn read_dir(dir: &Path) -> Result<Vec<Entry>, HistoryError> {
    let mut entries = Vec::new();
    for file in files_in(dir)? {
        entries.extend(read_file(&file)?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_a_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(format!("c1{HISTORY_SUFFIX}"));
        let entries = [
            Entry {
                client: "c1".to_owned(),
                process: 7,
                word: 2,
                op: WordOp::CompareSwap {
                    expected: 1,
                    new: 9,
                },
                invoked_ns: 10,
                completed_ns: 20,
                outcome: Outcome::Ok(WordRet::CompareSwap(1)),
            },
            Entry {
                client: "c1".to_owned(),
                process: 7,
                word: 0,
                op: WordOp::FetchAdd(3),
                invoked_ns: 30,
                completed_ns: 90,
                outcome: Outcome::Unknown("timed out".to_owned()),
            },
        ];
        let mut writer = HistoryWriter::create(&path).expect("create");
        for entry in &entries {
            writer.append(entry).expect("append");
        }
        writer.finish().expect("finish");
        assert_eq!(read_dir(dir.path()).expect("read"), entries);
    }

    #[test]
    fn a_broken_line_is_named_by_file_and_number() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(format!("c1{HISTORY_SUFFIX}"));
        std::fs::write(&path, "\n{\"client\": 3}\n").expect("write");
        let err = read_dir(dir.path()).expect_err("broken line");
        assert!(
            err.to_string().ends_with(
                "c1.history.jsonl:2: not a history entry (expected one JSON object per line)"
            ),
            "{err}"
        );
        let empty = tempfile::tempdir().expect("temp dir");
        let err = read_dir(empty.path()).expect_err("no history");
        assert!(matches!(err, HistoryError::NoHistory(_)), "{err}");
    }

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a, "{a} {b}");
    }
}
