//! The power-cut workload: its requests (WRITE_PERSIST, WRITE + FLUSH,
//! persistent exactly-once FETCH_ADD and COMPARE_SWAP), the ledger of what
//! the server acknowledged, and the check of the server's state after a
//! boot against it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use proto::request::{ExactlyOnce, Repr};

use super::PowerCutReport;
use crate::lab::raw_client::RawClient;

/// The workload's blocks: SLOTS blocks of BLOCK bytes after the words.
const SLOTS: u64 = 64;
const BLOCK: usize = 4096;
const BLOCKS_AT: u64 = 64 * 1024;
/// The FETCH_ADD counter and the COMPARE_SWAP chain.
const COUNTER_AT: u64 = 0;
const CHAIN_AT: u64 = 64;

/// One request of the workload.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    WritePersist {
        slot: u64,
        stamp: u64,
    },
    /// WRITE then FLUSH: acknowledged by the FLUSH.
    WriteFlush {
        slot: u64,
        stamp: u64,
    },
    FetchAdd {
        seq: u64,
    },
    CompareSwap {
        seq: u64,
        from: u64,
    },
}

/// What the host knows was acknowledged.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// The stamp of each block's last acknowledged write.
    blocks: Vec<Option<u64>>,
    counter: u64,
    chain: u64,
    next_stamp: u64,
    /// The driver's exactly-once session and its next sequence number.
    next_seq: u64,
    pub(super) acknowledged: u64,
}

/// The bytes of block `slot` written with `stamp`.
fn block(slot: u64, stamp: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK);
    let mut x = stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ slot;
    while out.len() < BLOCK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Runs `op` and returns the value it answered with; `Err` when the
/// connection died first. A status other than OK is an error too.
pub(super) fn run(client: &mut RawClient, op: Op) -> io::Result<u64> {
    let key = client.key();
    let once = |seq| ExactlyOnce::on_lane(0, seq).stamped(0);
    let answer = match op {
        Op::WritePersist { slot, stamp } => {
            let data = block(slot, stamp);
            client.call(Repr::write_persist(client.at(slot_at(slot)), key, &data))?
        }
        Op::WriteFlush { slot, stamp } => {
            let data = block(slot, stamp);
            client
                .call(Repr::write(client.at(slot_at(slot)), key, &data))?
                .ok("WRITE")?;
            client.call(Repr::flush(client.at(slot_at(slot)), key, BLOCK as u32))?
        }
        Op::FetchAdd { seq } => {
            let id = once(seq);
            client.call(
                Repr::fetch_add(client.at(COUNTER_AT), key, 1)
                    .with_exactly_once(id.client, id.seq)
                    .with_persist(),
            )?
        }
        Op::CompareSwap { seq, from } => {
            let id = once(seq);
            client.call(
                Repr::compare_swap(client.at(CHAIN_AT), key, from, from + 1)
                    .with_exactly_once(id.client, id.seq)
                    .with_persist(),
            )?
        }
    };
    Ok(answer.ok("request")?.value)
}

fn read(client: &mut RawClient, offset: u64, len: u32) -> anyhow::Result<Vec<u8>> {
    let key = client.key();
    let answer = client.call(Repr::read(client.at(offset), key, len))?;
    Ok(answer.ok("READ")?.data)
}

fn word(client: &mut RawClient, offset: u64) -> anyhow::Result<u64> {
    let bytes = read(client, offset, 8)?;
    let bytes: [u8; 8] = bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("short READ"))?;
    Ok(u64::from_le_bytes(bytes))
}

fn slot_at(slot: u64) -> u64 {
    BLOCKS_AT + slot * BLOCK as u64
}

impl Ledger {
    pub(super) fn new(session: u32) -> Ledger {
        Ledger {
            blocks: vec![None; SLOTS as usize],
            next_seq: u64::from(session) << 32,
            ..Ledger::default()
        }
    }

    /// The next request of the workload.
    pub(super) fn next(&mut self) -> Op {
        self.next_stamp += 1;
        let stamp = self.next_stamp;
        let slot = (stamp / 4) % SLOTS;
        match stamp % 4 {
            0 => Op::WritePersist { slot, stamp },
            1 => {
                self.next_seq += 1;
                Op::FetchAdd { seq: self.next_seq }
            }
            2 => Op::WriteFlush { slot, stamp },
            _ => {
                self.next_seq += 1;
                Op::CompareSwap {
                    seq: self.next_seq,
                    from: self.chain,
                }
            }
        }
    }

    /// Records that `op` was acknowledged with `value`.
    pub(super) fn acknowledge(&mut self, op: Op, value: u64) -> Result<(), String> {
        self.acknowledged += 1;
        match op {
            Op::WritePersist { slot, stamp } | Op::WriteFlush { slot, stamp } => {
                self.blocks[slot as usize] = Some(stamp);
            }
            Op::FetchAdd { .. } => {
                if value != self.counter {
                    return Err(format!(
                        "FETCH_ADD returned {value}, the counter was {}",
                        self.counter
                    ));
                }
                self.counter += 1;
            }
            Op::CompareSwap { from, .. } => {
                if value != from {
                    return Err(format!("COMPARE_SWAP returned {value}, expected {from}"));
                }
                self.chain = from + 1;
            }
        }
        Ok(())
    }
}

/// Checks the server's state after a boot against the ledger, retries the
/// interrupted exactly-once atomic, and counts what it checked.
pub(super) fn verify(
    link: &mut RawClient,
    ledger: &mut Ledger,
    in_flight: Option<Op>,
    report: &mut PowerCutReport,
) -> anyhow::Result<()> {
    let lose = |report: &mut PowerCutReport, what: String| {
        report.lost += 1;
        report.problems.push(what);
    };
    for slot in 0..SLOTS {
        let found = read(link, slot_at(slot), BLOCK as u32)?;
        let interrupted = match in_flight {
            Some(Op::WritePersist { slot: s, stamp } | Op::WriteFlush { slot: s, stamp })
                if s == slot =>
            {
                Some(stamp)
            }
            _ => None,
        };
        let acked = ledger.blocks[slot as usize];
        if acked.is_some() {
            report.blocks_checked += 1;
        }
        match judge_block(&found, slot, acked, interrupted) {
            Held::Acknowledged => {}
            Held::Interrupted => ledger.blocks[slot as usize] = interrupted,
            Held::Torn => {
                // Written again whole, so that the ledger names what it holds.
                report.torn += 1;
                ledger.next_stamp += 1;
                let op = Op::WritePersist {
                    slot,
                    stamp: ledger.next_stamp,
                };
                let value = run(link, op).context("rewrite a torn block")?;
                ledger.acknowledge(op, value).map_err(anyhow::Error::msg)?;
            }
            Held::Lost(what) => lose(
                report,
                format!("block {slot}: acknowledged stamp {acked:?} is not what it holds: {what}"),
            ),
        }
    }
    report.atomics_checked += 2;
    let counter = word(link, COUNTER_AT)?;
    let chain = word(link, CHAIN_AT)?;
    let counter_may_be = [ledger.counter, ledger.counter + 1];
    let fetch_add_running = matches!(in_flight, Some(Op::FetchAdd { .. }));
    if counter != ledger.counter && !(fetch_add_running && counter == ledger.counter + 1) {
        lose(
            report,
            format!("the counter holds {counter}, expected one of {counter_may_be:?}"),
        );
    }
    let swap_running = matches!(in_flight, Some(Op::CompareSwap { .. }));
    if chain != ledger.chain && !(swap_running && chain == ledger.chain + 1) {
        lose(
            report,
            format!("the chain holds {chain}, expected {}", ledger.chain),
        );
    }
    if let Some(op @ (Op::FetchAdd { .. } | Op::CompareSwap { .. })) = in_flight {
        // The client retries with the same sequence number: answered as if
        // it ran once.
        report.retries_checked += 1;
        let value = run(link, op).context("retry the interrupted atomic")?;
        if let Err(e) = ledger.acknowledge(op, value) {
            lose(report, format!("retry after the cut: {e}"));
        }
        let (held, expected) = match op {
            Op::FetchAdd { .. } => (word(link, COUNTER_AT)?, ledger.counter),
            _ => (word(link, CHAIN_AT)?, ledger.chain),
        };
        if held != expected {
            lose(
                report,
                format!("after the retry the word holds {held}, expected {expected}"),
            );
        }
    }
    Ok(())
}

/// What a block holds after a boot, against its last acknowledged write and
/// the write to it that a cut interrupted, if one did.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    /// The acknowledged write's bytes (zeroes if none was).
    Acknowledged,
    /// The interrupted write's bytes: it landed whole.
    Interrupted,
    /// Each 8-byte word is the acknowledged write's or the interrupted
    /// write's: the interrupted write landed in part. Persistent memory
    /// makes 8-byte stores failure-atomic, not whole blocks, and a write
    /// never acknowledged may leave any mix of its words and the old ones.
    Torn,
    /// Anything else, described: acknowledged bytes are gone.
    Lost(String),
}

fn judge_block(found: &[u8], slot: u64, acked: Option<u64>, interrupted: Option<u64>) -> Held {
    let bytes_of = |stamp: Option<u64>| match stamp {
        Some(stamp) => block(slot, stamp),
        None => vec![0; BLOCK],
    };
    let old = bytes_of(acked);
    if found == old {
        return Held::Acknowledged;
    }
    let new = interrupted.map(|stamp| block(slot, stamp));
    if new.as_deref() == Some(found) {
        return Held::Interrupted;
    }
    let (mut as_old, mut as_new, mut zero, mut other) = (0, 0, 0, 0);
    for (i, w) in found.chunks(8).enumerate() {
        let word_of = |bytes: &[u8]| bytes.get(i * 8..i * 8 + 8) == Some(w);
        if word_of(&old) {
            as_old += 1;
        } else if new.as_deref().is_some_and(word_of) {
            as_new += 1;
        } else if w.iter().all(|&b| b == 0) {
            zero += 1;
        } else {
            other += 1;
        }
    }
    if found.len() == BLOCK && zero == 0 && other == 0 {
        return Held::Torn;
    }
    Held::Lost(format!(
        "of its {} bytes in 8-byte words, {as_old} are the acknowledged write's, {as_new} the \
         interrupted write's ({interrupted:?}), {zero} zero and {other} something else",
        found.len()
    ))
}

/// Runs the workload until the power is cut; returns the request the cut
/// interrupted, if one was running.
pub(super) fn drive(
    link: &mut RawClient,
    ledger: &mut Ledger,
    cut: &AtomicBool,
) -> anyhow::Result<Option<Op>> {
    loop {
        let op = ledger.next();
        match run(link, op) {
            // Answered, so acknowledged, even if the power went since.
            Ok(value) => ledger.acknowledge(op, value).map_err(anyhow::Error::msg)?,
            Err(_) if cut.load(Ordering::SeqCst) => return Ok(Some(op)),
            Err(e) => return Err(e).context("the workload failed before the power cut"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: u64 = 3;

    fn mix(a: &[u8], b: &[u8], from_b: impl Fn(usize) -> bool) -> Vec<u8> {
        a.chunks(8)
            .zip(b.chunks(8))
            .enumerate()
            .flat_map(|(i, (a, b))| if from_b(i) { b } else { a }.to_vec())
            .collect()
    }

    #[test]
    fn a_block_is_the_acknowledged_write_the_interrupted_one_or_lost() {
        let (old, new) = (block(SLOT, 10), block(SLOT, 14));
        assert_eq!(
            judge_block(&old, SLOT, Some(10), Some(14)),
            Held::Acknowledged
        );
        assert_eq!(
            judge_block(&new, SLOT, Some(10), Some(14)),
            Held::Interrupted
        );
        assert_eq!(
            judge_block(&[0; BLOCK], SLOT, None, None),
            Held::Acknowledged
        );
        // Without an interrupted write to it, anything else is a loss.
        let Held::Lost(what) = judge_block(&new, SLOT, Some(10), None) else {
            panic!("a block no acknowledged write explains was accepted");
        };
        assert!(what.contains("512 something else"), "{what}");
    }

    #[test]
    fn an_interrupted_write_may_tear_its_block_at_8_byte_words_only() {
        let (old, new) = (block(SLOT, 10), block(SLOT, 14));
        let torn = mix(&old, &new, |i| i < 200);
        assert_eq!(judge_block(&torn, SLOT, Some(10), Some(14)), Held::Torn);
        // A never-written block torn by its first write: zeroes and new words.
        let first = mix(&[0; BLOCK], &new, |i| i % 2 == 0);
        assert_eq!(judge_block(&first, SLOT, None, Some(14)), Held::Torn);
        // A word of neither write is a loss, and so is a tear of the
        // acknowledged write by no interrupted write, and a short block.
        let mut foreign = torn.clone();
        foreign[4000] ^= 1;
        let Held::Lost(what) = judge_block(&foreign, SLOT, Some(10), Some(14)) else {
            panic!("a word of neither write was accepted");
        };
        assert!(what.contains("200 the interrupted write's"), "{what}");
        assert!(what.contains("1 something else"), "{what}");
        assert!(matches!(
            judge_block(&torn, SLOT, Some(10), None),
            Held::Lost(_)
        ));
        assert!(matches!(
            judge_block(&torn[..BLOCK - 8], SLOT, Some(10), Some(14)),
            Held::Lost(_)
        ));
    }
}
