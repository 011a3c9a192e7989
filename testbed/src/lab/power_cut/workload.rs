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
        let pending = match in_flight {
            Some(Op::WritePersist { slot: s, stamp } | Op::WriteFlush { slot: s, stamp })
                if s == slot =>
            {
                Some(stamp)
            }
            _ => None,
        };
        let acked = ledger.blocks[slot as usize];
        let matches = |stamp: Option<u64>| match stamp {
            Some(stamp) => found == block(slot, stamp),
            None => found.iter().all(|&b| b == 0),
        };
        if acked.is_some() {
            report.blocks_checked += 1;
        }
        let pending_landed = pending.is_some() && matches(pending);
        if !matches(acked) && !pending_landed {
            lose(
                report,
                format!("block {slot}: acknowledged stamp {acked:?} is not what it holds"),
            );
        }
        if pending_landed {
            ledger.blocks[slot as usize] = pending;
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
