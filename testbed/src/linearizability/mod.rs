//! Linearizability of a register workload's history, decided by a checker
//! this project did not write: stateright's `LinearizabilityTester`.
//!
//! The history ([`history`]) holds every operation on a handful of hot
//! words. Each word is an independent object, so each is checked alone
//! (linearizability is compositional), against [`spec::Word`]: READ,
//! store, COMPARE_SWAP and FETCH_ADD on one `u64` that starts at 0 (a run
//! stores 0 into each word, recorded, before its workers start).
//!
//! The tester is fed the invocations and returns in real-time order (at
//! equal times an invocation goes first, which only widens what counts as
//! concurrent). An operation whose outcome its client never learned is
//! given to the tester as invoked and never returned, which the tester
//! reads as what it is: it may take effect at any point after its
//! invocation, or never. The tester allows one operation in flight per
//! process, which is why a worker goes on as a new process after such an
//! operation. A READ of unknown outcome changes nothing and is left out.

pub mod history;
pub mod spec;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use history::{Entry, Outcome, WordOp, WordRet};
use spec::Word;

/// How long the check of all words may take before the words still
/// searched are called undecided (a non-linearizable history can make the
/// search exponential).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(120);

/// The most operations of a failing word the verdict prints (the last ones
/// of its shortest failing prefix); the history files hold all of them.
pub const MAX_PRINTED_OPS: usize = 80;

/// Process ids are below this; the search's own ids use the bit above.
const LAST_PROCESS: u64 = 1 << 63;

/// Stack for a word's search: the tester recurses once per operation.
const SEARCH_STACK: usize = 1 << 30;

/// What the check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearizabilityReport {
    /// Every word's history is linearizable.
    pub passed: bool,
    /// Operations in the history.
    pub ops: u64,
    /// Of them, how many had an outcome their client never learned.
    pub unknown: u64,
    /// Words checked.
    pub words: u64,
    /// Words with no linearization.
    pub failed_words: Vec<u64>,
    /// Words whose search did not end within the budget.
    pub undecided_words: Vec<u64>,
    /// The smallest failing word's history: its shortest failing prefix,
    /// one line per operation (the last [`MAX_PRINTED_OPS`]).
    pub failure: Vec<String>,
    /// Why the history could not be checked at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LinearizabilityReport {
    /// One line: `PASSED (N ops on K words, U of unknown outcome)`, or what
    /// failed.
    pub fn summary(&self) -> String {
        let counts = format!(
            "{} ops on {} words, {} of unknown outcome",
            self.ops, self.words, self.unknown
        );
        if self.passed {
            return format!("PASSED ({counts})");
        }
        if let Some(error) = &self.error {
            return format!("FAILED: {error}");
        }
        let mut why = Vec::new();
        if !self.failed_words.is_empty() {
            why.push(format!("no linearization of word {:?}", self.failed_words));
        }
        if !self.undecided_words.is_empty() {
            why.push(format!(
                "word {:?} undecided within the budget",
                self.undecided_words
            ));
        }
        format!("FAILED ({counts}): {}", why.join("; "))
    }
}

/// A history the tester cannot take: not one a register workload writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("process {process} of {client}: {what}; not a history of sequential processes")]
pub struct MalformedHistory {
    /// The process.
    pub process: u64,
    /// Its client.
    pub client: String,
    /// What is wrong.
    pub what: String,
}

/// Reads the history files of the run folder `dir` (see
/// [`history::files_in`]) and checks them; a history that cannot be read or
/// checked fails, saying why.
pub fn check_run(dir: &std::path::Path, budget: Duration) -> LinearizabilityReport {
    let checked = history::read_dir(dir)
        .map_err(|e| telemetry::logging::error_chain(&e))
        .and_then(|entries| check(&entries, budget).map_err(|e| e.to_string()));
    checked.unwrap_or_else(|why| LinearizabilityReport {
        error: Some(format!("the history could not be checked: {why}")),
        ..LinearizabilityReport::default()
    })
}

/// Checks every word of `entries` with a search budget of `budget`.
pub fn check(
    entries: &[Entry],
    budget: Duration,
) -> Result<LinearizabilityReport, MalformedHistory> {
    check_processes(entries)?;
    let mut by_word: BTreeMap<u64, Vec<Entry>> = BTreeMap::new();
    for entry in entries {
        by_word.entry(entry.word).or_default().push(entry.clone());
    }
    let mut report = LinearizabilityReport {
        ops: entries.len() as u64,
        unknown: entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Unknown(_)))
            .count() as u64,
        words: by_word.len() as u64,
        ..LinearizabilityReport::default()
    };
    let (tx, rx) = mpsc::channel();
    for (word, ops) in &by_word {
        let (tx, word, ops) = (tx.clone(), *word, ops.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("linearizability-word-{word}"))
            .stack_size(SEARCH_STACK)
            .spawn(move || {
                let verdict = judge_word(&ops);
                let _ = tx.send((word, ops.len(), verdict));
            });
        if spawned.is_err() {
            report.undecided_words.push(word);
        }
    }
    drop(tx);
    let deadline = Instant::now() + budget;
    let mut failures: Vec<(usize, u64, (u64, Vec<Entry>))> = Vec::new();
    let mut decided = Vec::new();
    while let Ok((word, len, verdict)) =
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        decided.push(word);
        if let Some(prefix) = verdict {
            report.failed_words.push(word);
            failures.push((len, word, prefix));
        }
    }
    report
        .undecided_words
        .extend(by_word.keys().filter(|w| !decided.contains(w)));
    report.failed_words.sort_unstable();
    report.undecided_words.sort_unstable();
    report.undecided_words.dedup();
    failures.sort_by_key(|(len, word, _)| (*len, *word));
    if let Some((_, word, prefix)) = failures.first() {
        let (from, ops) = prefix;
        report.failure = render(*word, *from, ops);
    }
    report.passed = report.failed_words.is_empty() && report.undecided_words.is_empty();
    Ok(report)
}

/// Refuses a history whose processes are not sequential: two operations
/// of one process overlapping, one after an operation of unknown outcome,
/// or one that completed before it was invoked.
fn check_processes(entries: &[Entry]) -> Result<(), MalformedHistory> {
    let mut by_process: HashMap<u64, Vec<&Entry>> = HashMap::new();
    for entry in entries {
        by_process.entry(entry.process).or_default().push(entry);
    }
    for (process, mut ops) in by_process {
        ops.sort_by_key(|e| e.invoked_ns);
        let malformed = |e: &Entry, what: String| MalformedHistory {
            process,
            client: e.client.clone(),
            what,
        };
        if process >= LAST_PROCESS {
            return Err(malformed(
                ops[0],
                format!("process ids end at {}", LAST_PROCESS - 1),
            ));
        }
        for pair in ops.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            if matches!(before.outcome, Outcome::Unknown(_)) {
                return Err(malformed(
                    after,
                    format!(
                        "an operation invoked at {} ns follows one of unknown outcome",
                        after.invoked_ns
                    ),
                ));
            }
            if after.invoked_ns <= before.completed_ns {
                return Err(malformed(
                    after,
                    format!(
                        "an operation invoked at {} ns overlaps one that completed at {} ns",
                        after.invoked_ns, before.completed_ns
                    ),
                ));
            }
        }
        if let Some(e) = ops.iter().find(|e| e.completed_ns < e.invoked_ns) {
            return Err(malformed(
                e,
                format!(
                    "an operation completed at {} ns, before it was invoked at {} ns",
                    e.completed_ns, e.invoked_ns
                ),
            ));
        }
    }
    Ok(())
}

/// Whether one word's operations are linearizable: `None` when they are;
/// otherwise the word's value at the last anchor and the operations from
/// there to the end of the first piece that has no linearization.
///
/// The history is cut at quiescent points: instants no operation of known
/// outcome spans, so everything before one precedes everything after it.
/// Each piece goes to the tester in turn, from the value the tester's
/// linearization of the pieces before left, with the operations of unknown
/// outcome it did not place carried into the next piece. When every piece
/// passes, their linearizations joined are one of the whole history. When a
/// piece has none from that value, another linearization of the pieces
/// before might have left another value (two concurrent stores nothing
/// read): the piece goes to the tester again joined with the one before it,
/// from where that one began, then with two, and so on back to the last
/// anchor — a quiescent point where the value is the same in every
/// linearization ([`is_anchor`]) — or the start of the history. Only the
/// tester's verdict from there fails the word.
fn judge_word(ops: &[Entry]) -> Option<(u64, Vec<Entry>)> {
    let mut ops: Vec<Entry> = ops
        .iter()
        // A READ of unknown outcome changes nothing, whether it happened
        // or not.
        .filter(|e| !(e.op == WordOp::Read && matches!(e.outcome, Outcome::Unknown(_))))
        .cloned()
        .collect();
    ops.sort_by_key(|e| (e.invoked_ns, e.process));
    let first_unknown = ops
        .iter()
        .position(|e| matches!(e.outcome, Outcome::Unknown(_)))
        .unwrap_or(ops.len());
    // Where each piece since the last rejoin began, and the tester's state
    // of the word there.
    let mut starts: Vec<(usize, Linearized)> = vec![(
        0,
        Linearized {
            end: Word(0),
            pending: Vec::new(),
        },
    )];
    for piece_end in quiescent_points(&ops) {
        let next = starts.iter().enumerate().rev().find_map(|(i, (from, at))| {
            serialize(at.end, &at.pending, &ops[*from..piece_end]).map(|next| (i, next))
        });
        let Some((joined, next)) = next else {
            let (from, at) = &starts[0];
            return Some((at.end.0, ops[*from..piece_end].to_vec()));
        };
        let piece_start = starts.last().map_or(0, |(from, _)| *from);
        if piece_end <= first_unknown && is_anchor(&ops[piece_start..piece_end]) {
            starts.clear();
        } else {
            starts.truncate(joined + 1);
        }
        starts.push((piece_end, next));
    }
    None
}

/// Whether the end of `piece` is an anchor, given that no operation of
/// unknown outcome came before it (one could still take effect later): the
/// piece ends with an operation invoked after all others of the piece
/// completed, so it is last in every linearization and the value it left
/// is known.
fn is_anchor(piece: &[Entry]) -> bool {
    let Some((last, before)) = piece.split_last() else {
        return false;
    };
    before.iter().all(|e| e.completed_ns < last.invoked_ns)
}

/// Where the pieces of `ops` (sorted by invocation) end: before every
/// operation invoked after all operations of known outcome before it
/// completed, and at the end.
fn quiescent_points(ops: &[Entry]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut horizon: Option<u64> = None;
    for (i, e) in ops.iter().enumerate() {
        if horizon.is_some_and(|h| e.invoked_ns > h) {
            ends.push(i);
        }
        let reach = match e.outcome {
            Outcome::Ok(_) => e.completed_ns,
            Outcome::Unknown(_) => e.invoked_ns,
        };
        horizon = Some(horizon.map_or(reach, |h| h.max(reach)));
    }
    ends.push(ops.len());
    ends
}

/// Where a linearization of a piece of history left the word.
struct Linearized {
    /// The word's value after it.
    end: Word,
    /// Operations of unknown outcome it did not place: they may still take
    /// effect later.
    pending: Vec<Entry>,
}

/// Stateright's linearization of `ops` (one word's, sorted by invocation)
/// from the value `start`, with `pending` (operations of unknown outcome
/// invoked before all of `ops`) free to take effect anywhere in it or not
/// at all; `None` when there is none.
fn serialize(start: Word, pending: &[Entry], ops: &[Entry]) -> Option<Linearized> {
    #[derive(Clone, Copy)]
    enum Event {
        Invoke(WordOp),
        Return(WordRet),
    }
    // The tester tries processes in the order of their ids: operations of
    // unknown outcome go last, so it places one only where the others
    // cannot explain what was seen.
    let mut events: Vec<(u64, u8, u64, Event)> = Vec::with_capacity(ops.len() * 2);
    let mut unknown: Vec<&Entry> = pending.iter().collect();
    for e in ops {
        match &e.outcome {
            Outcome::Unknown(_) => unknown.push(e),
            Outcome::Ok(ret) => {
                events.push((e.invoked_ns, 0, e.process, Event::Invoke(e.op)));
                events.push((e.completed_ns, 1, e.process, Event::Return(*ret)));
            }
        }
    }
    for e in &unknown {
        events.push((
            e.invoked_ns,
            0,
            e.process | LAST_PROCESS,
            Event::Invoke(e.op),
        ));
    }
    // At equal times an invocation goes first: only more is concurrent.
    events.sort_by_key(|(at, order, process, _)| (*at, *order, *process));
    let mut tester = LinearizabilityTester::new(start);
    for (_, _, process, event) in events {
        let fed = match event {
            Event::Invoke(op) => tester.on_invoke(process, op).map(drop),
            Event::Return(ret) => tester.on_return(process, ret).map(drop),
        };
        // Processes were checked sequential, so the tester takes every
        // event; were one refused, no linearization would have been shown.
        if fed.is_err() {
            return None;
        }
    }
    let order = tester.serialized_history()?;
    let mut end = start;
    // How many of each operation the linearization placed beyond those of
    // known outcome: that many of unknown outcome took effect.
    let mut placed: HashMap<WordOp, i64> = HashMap::new();
    for (op, _) in &order {
        stateright::semantics::SequentialSpec::invoke(&mut end, op);
        *placed.entry(*op).or_default() += 1;
    }
    for e in ops.iter().filter(|e| matches!(e.outcome, Outcome::Ok(_))) {
        *placed.entry(e.op).or_default() -= 1;
    }
    let pending = unknown
        .into_iter()
        .filter(|e| {
            let left = placed.entry(e.op).or_default();
            *left -= 1;
            *left < 0
        })
        .cloned()
        .collect();
    Some(Linearized { end, pending })
}

/// A failing word's history from the value `from`, one line per operation
/// in invocation order, times from its first invocation.
fn render(word: u64, from: u64, ops: &[Entry]) -> Vec<String> {
    let mut ops: Vec<&Entry> = ops.iter().collect();
    ops.sort_by_key(|e| (e.invoked_ns, e.process));
    let origin = ops.first().map_or(0, |e| e.invoked_ns);
    let at = |ns: u64| ns.saturating_sub(origin) as f64 / 1e6;
    let mut lines = vec![format!(
        "word {word}: from the value {from}, {} operations up to the first quiescent point \
         where they have no linearization{}",
        ops.len(),
        if ops.len() > MAX_PRINTED_OPS {
            format!(", the last {MAX_PRINTED_OPS} shown")
        } else {
            String::new()
        }
    )];
    for e in ops.iter().skip(ops.len().saturating_sub(MAX_PRINTED_OPS)) {
        let mut line = format!(
            "  {:>10.3} ms .. {:>10.3} ms  {} process {}  {}",
            at(e.invoked_ns),
            at(e.completed_ns),
            e.client,
            e.process,
            describe_op(e.op)
        );
        let _ = match &e.outcome {
            Outcome::Ok(ret) => write!(line, " -> {}", describe_ret(*ret)),
            Outcome::Unknown(why) => write!(line, " -> unknown ({why})"),
        };
        lines.push(line);
    }
    lines
}

fn describe_op(op: WordOp) -> String {
    match op {
        WordOp::Read => "read".to_owned(),
        WordOp::Write(v) => format!("write {v}"),
        WordOp::CompareSwap { expected, new } => format!("compare_swap {expected} -> {new}"),
        WordOp::FetchAdd(d) => format!("fetch_add {d}"),
    }
}

fn describe_ret(ret: WordRet) -> String {
    match ret {
        WordRet::Read(v) => format!("read {v}"),
        WordRet::Write => "ok".to_owned(),
        WordRet::CompareSwap(v) => format!("found {v}"),
        WordRet::FetchAdd(v) => format!("found {v}"),
    }
}

#[cfg(test)]
mod tests;
