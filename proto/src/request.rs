//! One-sided request bodies: READ, WRITE, WRITE_PERSIST, FLUSH and the three
//! 8-byte atomics.
//!
//! ```text
//! 0      flags    u8: PERSIST | REGION_ADDRESSED | EXACTLY_ONCE | NON_TEMPORAL | ON_BEHALF
//!                 | RECORDED
//! 1..4   reserved zero
//! 4..8   region   u32 (zero unless REGION_ADDRESSED)
//! 8..16  addr     u64 PmemAddr, or the offset inside `region`
//! 16..24 key      u64
//! 24..28 length   u32
//! 28..32 client   u32 (zero unless EXACTLY_ONCE or ON_BEHALF)
//! 32..40 seq      u64 (zero unless EXACTLY_ONCE)
//! 40..48 operand  u64 swap / add / store value
//! 48..56 compare  u64 compare value of COMPARE_SWAP
//! 56..   payload  WRITE / WRITE_PERSIST: exactly `length` bytes; an ATOMIC_WRITE
//!                 with RECORDED: the record of the atomic it stores the outcome
//!                 of ([`crate::atomic_record`]); others: none
//! ```
//!
//! `length` is the number of bytes to read, write or flush; for the atomics it
//! is 8. READ and WRITE lengths are at most [`MAX_DATA_LEN`].

use core::fmt;

use crate::atomic_record::{AtomicRecord, RECORD_LEN};
use crate::error::{Error, Result};
use crate::le;
use crate::limits::MAX_DATA_LEN;
use crate::opcode::Opcode;
use crate::view::wire_view;
use crate::{AccessKey, PmemAddr, RegionIndex, RegionOffset};

/// Byte ranges of a request body.
pub mod field {
    use crate::{Field, Rest};

    /// Flag bits, see [`super::flags`].
    pub const FLAGS: usize = 0;
    /// Reserved, zero.
    pub const RESERVED: Field = 1..4;
    /// Region index (region-addressed requests).
    pub const REGION: Field = 4..8;
    /// PMEM address, or offset inside the region.
    pub const ADDR: Field = 8..16;
    /// Protection key.
    pub const KEY: Field = 16..24;
    /// Bytes to read, write or flush.
    pub const LENGTH: Field = 24..28;
    /// Client id (exactly-once requests).
    pub const CLIENT: Field = 28..32;
    /// Per-client sequence number (exactly-once requests).
    pub const SEQ: Field = 32..40;
    /// Swap, add or store value of an atomic.
    pub const OPERAND: Field = 40..48;
    /// Compare value of COMPARE_SWAP.
    pub const COMPARE: Field = 48..56;
    /// Write data.
    pub const PAYLOAD: Rest = 56..;
}

/// Bits of the flags byte.
pub mod flags {
    /// Make the effect durable before acknowledging.
    pub const PERSIST: u8 = 1 << 0;
    /// `addr` is an offset inside `region`; otherwise a PMEM address.
    pub const REGION_ADDRESSED: u8 = 1 << 1;
    /// `client` and `seq` identify the request for exactly-once execution.
    pub const EXACTLY_ONCE: u8 = 1 << 2;
    /// Hint: bypass the server's CPU cache (non-temporal stores).
    pub const NON_TEMPORAL: u8 = 1 << 3;
    /// A fabric device forwards this request for the client whose number
    /// it stamped in bits 0..24 of `client`.
    pub const ON_BEHALF: u8 = 1 << 4;
    /// An ATOMIC_WRITE carrying the record of the COMPARE_SWAP or
    /// FETCH_ADD whose outcome it stores, under its EXACTLY_ONCE identity
    /// (see [`crate::atomic_record`]); only with ATOMIC_WRITE and
    /// EXACTLY_ONCE.
    pub const RECORDED: u8 = 1 << 5;
    /// Every defined bit; the others must be zero.
    pub const ALL: u8 =
        PERSIST | REGION_ADDRESSED | EXACTLY_ONCE | NON_TEMPORAL | ON_BEHALF | RECORDED;
}

/// Length of the fixed part of a request body.
pub const HEADER_LEN: usize = 56;
pub use crate::limits::ATOMIC_LEN;

wire_view! {
    /// A read/write view of a request body.
    ///
    /// `check_len` looks only at the fixed part; whether the payload fits
    /// the opcode and `length` is checked by [`Repr::parse`].
    pub struct Packet;
    error: Error;
    at_least: HEADER_LEN;
    payload: field::PAYLOAD;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The reserved bytes 1..4 as a number (zero when well formed).
    pub fn reserved(&self) -> u32 {
        let r = &self.buffer.as_ref()[field::RESERVED];
        u32::from(r[0]) | u32::from(r[1]) << 8 | u32::from(r[2]) << 16
    }

    /// The region index.
    pub fn region(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::REGION])
    }

    /// The address (PMEM address or in-region offset).
    pub fn addr(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::ADDR])
    }

    /// The protection key.
    pub fn key(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::KEY])
    }

    /// The length field.
    pub fn length(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::LENGTH])
    }

    /// The client id.
    pub fn client(&self) -> u32 {
        le::u32_at(&self.buffer.as_ref()[field::CLIENT])
    }

    /// The sequence number.
    pub fn seq(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::SEQ])
    }

    /// The atomic operand.
    pub fn operand(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::OPERAND])
    }

    /// The compare value.
    pub fn compare(&self) -> u64 {
        le::u64_at(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the raw flags byte.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }

    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED].fill(0);
    }

    /// Sets the region index.
    pub fn set_region(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::REGION], value);
    }

    /// Sets the address.
    pub fn set_addr(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::ADDR], value);
    }

    /// Sets the protection key.
    pub fn set_key(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::KEY], value);
    }

    /// Sets the length field.
    pub fn set_length(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::LENGTH], value);
    }

    /// Sets the client id.
    pub fn set_client(&mut self, value: u32) {
        le::put_u32(&mut self.buffer.as_mut()[field::CLIENT], value);
    }

    /// Sets the sequence number.
    pub fn set_seq(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::SEQ], value);
    }

    /// Sets the atomic operand.
    pub fn set_operand(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::OPERAND], value);
    }

    /// Sets the compare value.
    pub fn set_compare(&mut self, value: u64) {
        le::put_u64(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

/// The seven one-sided operations: the request opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Read `length` bytes.
    Read,
    /// Write the payload.
    Write,
    /// Write the payload and acknowledge once durable.
    WritePersist,
    /// Make `length` bytes durable.
    Flush,
    /// 8-byte compare-and-swap; answered with the old value.
    CompareSwap,
    /// 8-byte fetch-and-add; answered with the old value.
    FetchAdd,
    /// 8-byte atomic store.
    AtomicWrite,
}

impl Operation {
    /// Whether the operation changes memory (a read-only grant refuses it):
    /// WRITE, WRITE_PERSIST and the atomics; not READ or FLUSH.
    pub fn changes_memory(self) -> bool {
        !matches!(self, Operation::Read | Operation::Flush)
    }

    /// Every operation.
    pub const ALL: [Operation; 7] = [
        Operation::Read,
        Operation::Write,
        Operation::WritePersist,
        Operation::Flush,
        Operation::CompareSwap,
        Operation::FetchAdd,
        Operation::AtomicWrite,
    ];

    /// The operation's position in [`Operation::ALL`], for tables indexed by
    /// operation.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The operation with this opcode, if it is a request opcode.
    pub fn from_opcode(opcode: Opcode) -> Option<Operation> {
        Some(match opcode {
            Opcode::Read => Operation::Read,
            Opcode::Write => Operation::Write,
            Opcode::WritePersist => Operation::WritePersist,
            Opcode::Flush => Operation::Flush,
            Opcode::CompareSwap => Operation::CompareSwap,
            Opcode::FetchAdd => Operation::FetchAdd,
            Opcode::AtomicWrite => Operation::AtomicWrite,
            _ => return None,
        })
    }

    /// The frame opcode.
    pub fn opcode(self) -> Opcode {
        match self {
            Operation::Read => Opcode::Read,
            Operation::Write => Opcode::Write,
            Operation::WritePersist => Opcode::WritePersist,
            Operation::Flush => Opcode::Flush,
            Operation::CompareSwap => Opcode::CompareSwap,
            Operation::FetchAdd => Opcode::FetchAdd,
            Operation::AtomicWrite => Opcode::AtomicWrite,
        }
    }

    /// Whether the request carries `length` bytes of payload.
    pub fn carries_payload(self) -> bool {
        matches!(self, Operation::Write | Operation::WritePersist)
    }

    /// Whether this is an 8-byte atomic.
    pub fn is_atomic(self) -> bool {
        self.opcode().is_atomic()
    }

    /// How many bytes of memory a request of this operation touches, given
    /// its `length` field: [`ATOMIC_LEN`] for the atomics, `length` for the
    /// others (for writes that is the payload's length, see [`Repr::check`]).
    /// Keys, bounds and grants are checked over this span.
    pub fn span_len(self, length: u32) -> u32 {
        if self.is_atomic() { ATOMIC_LEN } else { length }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.opcode().fmt(f)
    }
}

/// Where a request operates: a PMEM address (client → fabric device) or a
/// region offset (fabric device → server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A location in the pool-wide PMEM space; REGION_ADDRESSED clear.
    Pmem(PmemAddr),
    /// A location inside one region; REGION_ADDRESSED set.
    Region(RegionOffset),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pmem(addr) => addr.fmt(f),
            Target::Region(offset) => offset.fmt(f),
        }
    }
}

/// Identity of a request for exactly-once execution: a retried request with
/// the same pair gets the first result instead of being applied twice.
///
/// `client` is split in two: bits 0..24 are the client's number, which the
/// fabric device stamps (whatever the client sent there), and bits 24..32
/// the *lane* the client chose. Each (client, lane) pair numbers its
/// requests on its own, in increasing order: lane 0 is for requests that
/// carry their number in the frame, lanes 1..=255 for RDMA queue pairs
/// whose atomics the device numbers (see `qp::AtomicSeq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExactlyOnce {
    /// The lane (bits 24..32) and the client's number (bits 0..24).
    pub client: u32,
    /// The sequence number of this request on its lane.
    pub seq: u64,
}

/// Where the lane sits in [`ExactlyOnce::client`].
pub const LANE_SHIFT: u32 = 24;
/// The bits of [`ExactlyOnce::client`] that number the client.
pub const CLIENT_NUMBER_MASK: u32 = (1 << LANE_SHIFT) - 1;

impl ExactlyOnce {
    /// An identity on `lane` of a client, before the device stamps the
    /// client's number.
    pub fn on_lane(lane: u8, seq: u64) -> Self {
        ExactlyOnce {
            client: u32::from(lane) << LANE_SHIFT,
            seq,
        }
    }

    /// The lane.
    pub fn lane(self) -> u8 {
        (self.client >> LANE_SHIFT) as u8
    }

    /// The same identity with the client number the device knows the
    /// client by (`number` must fit in 24 bits).
    pub fn stamped(self, number: u32) -> Self {
        ExactlyOnce {
            client: (self.client & !CLIENT_NUMBER_MASK) | (number & CLIENT_NUMBER_MASK),
            seq: self.seq,
        }
    }
}

/// A parsed request body; the payload is borrowed, never copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// The operation (the frame's opcode).
    pub operation: Operation,
    /// Where to operate.
    pub target: Target,
    /// The key that opens the target range.
    pub key: AccessKey,
    /// Bytes to read, write or flush; [`ATOMIC_LEN`] for atomics; equal to
    /// `payload.len()` for writes.
    pub length: u32,
    /// Set when the request must be executed at most once.
    pub exactly_once: Option<ExactlyOnce>,
    /// The client a fabric device forwards this request for (its number),
    /// stamped by the device (ON_BEHALF).
    pub on_behalf: Option<u32>,
    /// The PERSIST flag: make the effect durable before acknowledging
    /// (implied by WRITE_PERSIST and FLUSH, see [`Repr::must_persist`]).
    pub persist: bool,
    /// Hint to bypass the server's CPU cache.
    pub non_temporal: bool,
    /// Swap, add or store value of an atomic; zero otherwise.
    pub operand: u64,
    /// Compare value of COMPARE_SWAP; zero otherwise.
    pub compare: u64,
    /// Write data; empty for other operations.
    pub payload: &'a [u8],
}

impl<'a> Repr<'a> {
    fn plain(operation: Operation, target: Target, key: AccessKey, length: u32) -> Self {
        Repr {
            operation,
            target,
            key,
            length,
            exactly_once: None,
            on_behalf: None,
            persist: false,
            non_temporal: false,
            operand: 0,
            compare: 0,
            payload: &[],
        }
    }

    /// READ of `length` bytes.
    pub fn read(target: Target, key: AccessKey, length: u32) -> Self {
        Self::plain(Operation::Read, target, key, length)
    }

    /// WRITE of `data` ([`Repr::check`] says whether it fits [`MAX_DATA_LEN`]).
    pub fn write(target: Target, key: AccessKey, data: &'a [u8]) -> Self {
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        Repr {
            payload: data,
            ..Self::plain(Operation::Write, target, key, length)
        }
    }

    /// WRITE_PERSIST of `data`: acknowledged once durable.
    pub fn write_persist(target: Target, key: AccessKey, data: &'a [u8]) -> Self {
        Repr {
            operation: Operation::WritePersist,
            ..Self::write(target, key, data)
        }
    }

    /// FLUSH of `length` bytes.
    pub fn flush(target: Target, key: AccessKey, length: u32) -> Self {
        Self::plain(Operation::Flush, target, key, length)
    }

    /// COMPARE_SWAP: store `swap` if the current value equals `compare`.
    pub fn compare_swap(target: Target, key: AccessKey, compare: u64, swap: u64) -> Self {
        Repr {
            operand: swap,
            compare,
            ..Self::plain(Operation::CompareSwap, target, key, ATOMIC_LEN)
        }
    }

    /// FETCH_ADD of `add` (wrapping).
    pub fn fetch_add(target: Target, key: AccessKey, add: u64) -> Self {
        Repr {
            operand: add,
            ..Self::plain(Operation::FetchAdd, target, key, ATOMIC_LEN)
        }
    }

    /// ATOMIC_WRITE of `value`.
    pub fn atomic_write(target: Target, key: AccessKey, value: u64) -> Self {
        Repr {
            operand: value,
            ..Self::plain(Operation::AtomicWrite, target, key, ATOMIC_LEN)
        }
    }

    /// This ATOMIC_WRITE carrying `record` (its bytes, from
    /// [`AtomicRecord::to_bytes`]): the RECORDED flag is set on the wire
    /// and the record is the payload. It needs an exactly-once identity
    /// ([`Repr::check`]).
    pub fn recording(self, record: &'a [u8; RECORD_LEN]) -> Self {
        Repr {
            payload: record,
            ..self
        }
    }

    /// The record an ATOMIC_WRITE carries (RECORDED), if it carries one
    /// that parses.
    pub fn record(&self) -> Option<AtomicRecord> {
        match self.operation {
            Operation::AtomicWrite if !self.payload.is_empty() => {
                AtomicRecord::parse(self.payload).ok()
            }
            _ => None,
        }
    }

    /// Whether this is an ATOMIC_WRITE with a record (the RECORDED flag).
    pub fn carries_record(&self) -> bool {
        self.operation == Operation::AtomicWrite && !self.payload.is_empty()
    }

    /// This request, marked for exactly-once execution.
    pub fn with_exactly_once(self, client: u32, seq: u64) -> Self {
        Repr {
            exactly_once: Some(ExactlyOnce { client, seq }),
            ..self
        }
    }

    /// This request with the PERSIST flag set.
    pub fn with_persist(self) -> Self {
        Repr {
            persist: true,
            ..self
        }
    }

    /// This request with the NON_TEMPORAL hint set.
    pub fn with_non_temporal(self) -> Self {
        Repr {
            non_temporal: true,
            ..self
        }
    }

    /// Parses a request body for `operation`.
    ///
    /// Rejects unknown flag bits and non-zero reserved bytes, a non-zero
    /// `region` without REGION_ADDRESSED, non-zero `client`/`seq` without
    /// EXACTLY_ONCE (`ReservedBits`); a payload whose length is not `length`
    /// for writes or not zero otherwise, an atomic `length` other than 8
    /// (`LengthMismatch`); a READ/WRITE length above [`MAX_DATA_LEN`]
    /// (`DataTooLong`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&'a T>,
        operation: Operation,
    ) -> Result<Repr<'a>> {
        packet.check_len()?;
        let flags = packet.flags();
        if flags & !flags::ALL != 0 {
            return Err(Error::ReservedBits {
                what: "request flags",
                value: flags.into(),
            });
        }
        if packet.reserved() != 0 {
            return Err(Error::ReservedBits {
                what: "request reserved bytes",
                value: packet.reserved().into(),
            });
        }
        let target = if flags & flags::REGION_ADDRESSED != 0 {
            Target::Region(RegionOffset::new(
                RegionIndex(packet.region()),
                packet.addr(),
            ))
        } else if packet.region() != 0 {
            return Err(Error::ReservedBits {
                what: "region of a PMEM-addressed request",
                value: packet.region().into(),
            });
        } else {
            Target::Pmem(PmemAddr(packet.addr()))
        };
        let on_behalf =
            (flags & flags::ON_BEHALF != 0).then(|| packet.client() & CLIENT_NUMBER_MASK);
        let exactly_once = if flags & flags::EXACTLY_ONCE != 0 {
            Some(ExactlyOnce {
                client: packet.client(),
                seq: packet.seq(),
            })
        } else if (on_behalf.is_none() && packet.client() != 0)
            || (on_behalf.is_some() && packet.client() & !CLIENT_NUMBER_MASK != 0)
            || packet.seq() != 0
        {
            return Err(Error::ReservedBits {
                what: "client/seq of a request without EXACTLY_ONCE",
                value: if packet.seq() != 0 {
                    packet.seq()
                } else {
                    packet.client().into()
                },
            });
        } else {
            None
        };
        let recorded = flags & flags::RECORDED != 0;
        if recorded && operation != Operation::AtomicWrite {
            return Err(Error::ReservedBits {
                what: "RECORDED flag of a request other than ATOMIC_WRITE",
                value: flags.into(),
            });
        }
        let payload_len = packet.payload().len();
        if operation == Operation::AtomicWrite && recorded != (payload_len != 0) {
            return Err(Error::LengthMismatch {
                what: if recorded {
                    "atomic record of an ATOMIC_WRITE with RECORDED"
                } else {
                    "payload of a request without data"
                },
                expected: if recorded { RECORD_LEN } else { 0 },
                got: payload_len,
            });
        }
        let repr = Repr {
            operation,
            target,
            key: AccessKey(packet.key()),
            length: packet.length(),
            exactly_once,
            on_behalf,
            persist: flags & flags::PERSIST != 0,
            non_temporal: flags & flags::NON_TEMPORAL != 0,
            operand: packet.operand(),
            compare: packet.compare(),
            payload: packet.payload(),
        };
        repr.check()?;
        Ok(repr)
    }

    /// Checks the consistency rules [`Repr::parse`] enforces on lengths, so a
    /// hand-built value can be checked before [`Repr::emit`].
    pub fn check(&self) -> Result<()> {
        if self.payload.len() > MAX_DATA_LEN as usize {
            return Err(Error::DataTooLong {
                len: self.payload.len() as u64,
            });
        }
        if self.carries_record() {
            AtomicRecord::parse(self.payload)?;
            if self.exactly_once.is_none() {
                return Err(Error::ReservedBits {
                    what: "RECORDED flag of an ATOMIC_WRITE without EXACTLY_ONCE",
                    value: flags::RECORDED.into(),
                });
            }
        } else {
            let expected_payload = if self.operation.carries_payload() {
                self.length as usize
            } else {
                0
            };
            if self.payload.len() != expected_payload {
                return Err(Error::LengthMismatch {
                    what: if self.operation.carries_payload() {
                        "write payload"
                    } else {
                        "payload of a request without data"
                    },
                    expected: expected_payload,
                    got: self.payload.len(),
                });
            }
        }
        match self.operation {
            Operation::Read | Operation::Write | Operation::WritePersist
                if self.length > MAX_DATA_LEN =>
            {
                Err(Error::DataTooLong {
                    len: self.length.into(),
                })
            }
            op if op.is_atomic() && self.length != ATOMIC_LEN => Err(Error::LengthMismatch {
                what: "atomic length",
                expected: ATOMIC_LEN as usize,
                got: self.length as usize,
            }),
            _ => Ok(()),
        }
    }

    /// How many bytes of memory this request touches, starting at its
    /// target ([`Operation::span_len`]).
    pub fn span_len(&self) -> u32 {
        self.operation.span_len(self.length)
    }

    /// Whether the effect must be durable before the acknowledgement: the
    /// PERSIST flag, or an operation that implies it.
    pub fn must_persist(&self) -> bool {
        self.persist || matches!(self.operation, Operation::WritePersist | Operation::Flush)
    }

    /// The flags byte this value encodes to.
    pub fn flags(&self) -> u8 {
        let mut bits = 0;
        if self.persist {
            bits |= flags::PERSIST;
        }
        if matches!(self.target, Target::Region(_)) {
            bits |= flags::REGION_ADDRESSED;
        }
        if self.exactly_once.is_some() {
            bits |= flags::EXACTLY_ONCE;
        }
        if self.non_temporal {
            bits |= flags::NON_TEMPORAL;
        }
        if self.on_behalf.is_some() {
            bits |= flags::ON_BEHALF;
        }
        if self.carries_record() {
            bits |= flags::RECORDED;
        }
        bits
    }

    /// Length of the body this value encodes to.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes this value into a body of at least [`Repr::buffer_len`] bytes.
    ///
    /// Writes what it is given; call [`Repr::check`] first for hand-built
    /// values ([`crate::Message::emit`] does).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_flags(self.flags());
        packet.clear_reserved();
        let (region, addr) = match self.target {
            Target::Pmem(addr) => (0, addr.0),
            Target::Region(offset) => (offset.region.0, offset.offset),
        };
        packet.set_region(region);
        packet.set_addr(addr);
        packet.set_key(self.key.get());
        packet.set_length(self.length);
        let (client, seq) = self.exactly_once.map_or((0, 0), |e| (e.client, e.seq));
        // With both, the exactly-once field's client number is the one the
        // device acts for.
        let client = match self.on_behalf {
            Some(number) => (client & !CLIENT_NUMBER_MASK) | (number & CLIENT_NUMBER_MASK),
            None => client,
        };
        packet.set_client(client);
        packet.set_seq(seq);
        packet.set_operand(self.operand);
        packet.set_compare(self.compare);
        packet.payload_mut()[..self.payload.len()].copy_from_slice(self.payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_is_the_length_or_the_atomic_width() {
        let at = Target::Pmem(PmemAddr(0));
        let key = AccessKey::NONE;
        assert_eq!(Repr::read(at, key, 4096).span_len(), 4096);
        assert_eq!(Repr::flush(at, key, 64).span_len(), 64);
        assert_eq!(Repr::write(at, key, b"hello").span_len(), 5);
        assert_eq!(Repr::write_persist(at, key, b"hi").span_len(), 2);
        assert_eq!(Repr::fetch_add(at, key, 1).span_len(), 8);
        assert_eq!(Repr::compare_swap(at, key, 1, 2).span_len(), 8);
        assert_eq!(Repr::atomic_write(at, key, 3).span_len(), 8);
        // An atomic spans its width whatever an unchecked length says.
        assert_eq!(Operation::FetchAdd.span_len(0), 8);
        assert_eq!(Operation::Read.span_len(0), 0);
    }

    #[test]
    fn a_largest_data_transfer_fits_a_frame_body() {
        assert!(
            crate::limits::MAX_BODY_LEN as usize >= HEADER_LEN + MAX_DATA_LEN as usize,
            "a request of MAX_DATA_LEN must fit a frame"
        );
    }

    #[test]
    fn operation_index_is_its_place_in_all() {
        for (i, op) in Operation::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(Operation::from_opcode(op.opcode()), Some(op));
        }
    }

    // WRITE_PERSIST of "hello" to region 3 offset 0x1000, key 0xAABB, exactly
    // once as client 7 seq 42, non-temporal.
    const BYTES: [u8; 61] = [
        0x0F, 0x00, 0x00, 0x00, // flags, reserved
        0x03, 0x00, 0x00, 0x00, // region
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // addr
        0xBB, 0xAA, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // key
        0x05, 0x00, 0x00, 0x00, // length
        0x07, 0x00, 0x00, 0x00, // client
        0x2A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // seq
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // operand
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
        b'h', b'e', b'l', b'l', b'o', // payload
    ];

    fn repr() -> Repr<'static> {
        Repr::write_persist(
            Target::Region(RegionOffset::new(RegionIndex(3), 0x1000)),
            AccessKey(0xAABB),
            b"hello",
        )
        .with_exactly_once(7, 42)
        .with_persist()
        .with_non_temporal()
    }

    // COMPARE_SWAP at PMEM address 0x4000_0000, key 1: if 5 then 6.
    const CAS: [u8; 56] = [
        0x00, 0x00, 0x00, 0x00, // flags, reserved
        0x00, 0x00, 0x00, 0x00, // region
        0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, // addr
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // key
        0x08, 0x00, 0x00, 0x00, // length
        0x00, 0x00, 0x00, 0x00, // client
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // seq
        0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // operand (swap)
        0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
    ];

    #[test]
    fn construct() {
        let mut bytes = [0xFFu8; 61];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_flags(
            flags::PERSIST | flags::REGION_ADDRESSED | flags::EXACTLY_ONCE | flags::NON_TEMPORAL,
        );
        packet.clear_reserved();
        packet.set_region(3);
        packet.set_addr(0x1000);
        packet.set_key(0xAABB);
        packet.set_length(5);
        packet.set_client(7);
        packet.set_seq(42);
        packet.set_operand(0);
        packet.set_compare(0);
        packet.payload_mut().copy_from_slice(b"hello");
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.flags(), 0x0F);
        assert_eq!(packet.reserved(), 0);
        assert_eq!(packet.region(), 3);
        assert_eq!(packet.addr(), 0x1000);
        assert_eq!(packet.key(), 0xAABB);
        assert_eq!(packet.length(), 5);
        assert_eq!(packet.client(), 7);
        assert_eq!(packet.seq(), 42);
        assert_eq!(packet.operand(), 0);
        assert_eq!(packet.compare(), 0);
        assert_eq!(packet.payload(), b"hello");
    }

    #[test]
    fn parse() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            Repr::parse(&packet, Operation::WritePersist).unwrap(),
            repr()
        );
        let cas = Packet::new_checked(&CAS[..]).unwrap();
        assert_eq!(
            Repr::parse(&cas, Operation::CompareSwap).unwrap(),
            Repr::compare_swap(Target::Pmem(PmemAddr(0x4000_0000)), AccessKey(1), 5, 6)
        );
    }

    #[test]
    fn emit() {
        let repr = repr();
        assert_eq!(repr.buffer_len(), 61);
        let mut bytes = [0xFFu8; 61];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);

        let cas = Repr::compare_swap(Target::Pmem(PmemAddr(0x4000_0000)), AccessKey(1), 5, 6);
        let mut bytes = [0xFFu8; 56];
        cas.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, CAS);
    }

    fn parse_bytes(bytes: &[u8], operation: Operation) -> Result<Repr<'_>> {
        Repr::parse(&Packet::new_checked(bytes)?, operation)
    }

    #[test]
    fn rejects_short_body() {
        assert_eq!(
            parse_bytes(&BYTES[..55], Operation::Write),
            Err(Error::Truncated {
                needed: 56,
                got: 55
            })
        );
    }

    #[test]
    fn rejects_payload_not_matching_length() {
        assert_eq!(
            parse_bytes(&BYTES[..60], Operation::WritePersist),
            Err(Error::LengthMismatch {
                what: "write payload",
                expected: 5,
                got: 4
            })
        );
        let mut long = BYTES.to_vec();
        long.push(b'!');
        assert_eq!(
            parse_bytes(&long, Operation::Write),
            Err(Error::LengthMismatch {
                what: "write payload",
                expected: 5,
                got: 6
            })
        );
        // A READ carries no payload.
        assert!(matches!(
            parse_bytes(&BYTES, Operation::Read),
            Err(Error::LengthMismatch { expected: 0, .. })
        ));
    }

    #[test]
    fn on_behalf_carries_the_client_number_with_or_without_exactly_once() {
        let read = Repr {
            on_behalf: Some(7),
            ..Repr::read(Target::Pmem(PmemAddr(64)), AccessKey(1), 8)
        };
        let mut body = vec![0u8; read.buffer_len()];
        read.emit(&mut Packet::new_unchecked(&mut body[..]));
        let parsed = Repr::parse(&Packet::new_checked(&body[..]).unwrap(), Operation::Read);
        assert_eq!(parsed, Ok(read));
        // With exactly-once: the lane stays, the number is the device's.
        let add = Repr {
            on_behalf: Some(3),
            ..Repr::fetch_add(Target::Pmem(PmemAddr(64)), AccessKey(1), 1)
                .with_exactly_once(ExactlyOnce::on_lane(2, 0).client, 9)
        };
        let mut body = vec![0u8; add.buffer_len()];
        add.emit(&mut Packet::new_unchecked(&mut body[..]));
        let parsed = Repr::parse(
            &Packet::new_checked(&body[..]).unwrap(),
            Operation::FetchAdd,
        )
        .unwrap();
        assert_eq!(parsed.on_behalf, Some(3));
        assert_eq!(
            parsed
                .exactly_once
                .map(|e| (e.lane(), e.client & CLIENT_NUMBER_MASK, e.seq)),
            Some((2, 3, 9))
        );
        // Without either flag the client field must be zero; with ON_BEHALF
        // alone its lane bits must be zero too.
        let mut body = vec![0u8; read.buffer_len()];
        read.emit(&mut Packet::new_unchecked(&mut body[..]));
        body[31] = 1;
        assert!(Repr::parse(&Packet::new_checked(&body[..]).unwrap(), Operation::Read).is_err());
    }

    #[test]
    fn rejects_reserved_bits() {
        for bit in 6..8 {
            let mut bytes = BYTES;
            bytes[0] |= 1 << bit;
            assert_eq!(
                parse_bytes(&bytes, Operation::WritePersist),
                Err(Error::ReservedBits {
                    what: "request flags",
                    value: u64::from(bytes[0])
                })
            );
        }
        // RECORDED belongs to ATOMIC_WRITE alone.
        let mut bytes = BYTES;
        bytes[0] |= flags::RECORDED;
        assert!(matches!(
            parse_bytes(&bytes, Operation::WritePersist),
            Err(Error::ReservedBits {
                what: "RECORDED flag of a request other than ATOMIC_WRITE",
                ..
            })
        ));
        for at in 1..4 {
            let mut bytes = BYTES;
            bytes[at] = 1;
            assert!(matches!(
                parse_bytes(&bytes, Operation::WritePersist),
                Err(Error::ReservedBits { .. })
            ));
        }
        // Fields a clear flag disables must be zero.
        let mut bytes = CAS;
        bytes[4] = 9;
        assert!(matches!(
            parse_bytes(&bytes, Operation::CompareSwap),
            Err(Error::ReservedBits { value: 9, .. })
        ));
        let mut bytes = CAS;
        bytes[33] = 1;
        assert!(matches!(
            parse_bytes(&bytes, Operation::CompareSwap),
            Err(Error::ReservedBits { value: 256, .. })
        ));
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut bytes = CAS;
        bytes[24] = 4;
        assert_eq!(
            parse_bytes(&bytes, Operation::CompareSwap),
            Err(Error::LengthMismatch {
                what: "atomic length",
                expected: 8,
                got: 4
            })
        );
        let read = Repr::read(Target::Pmem(PmemAddr(0)), AccessKey::NONE, MAX_DATA_LEN + 1);
        assert_eq!(
            read.check(),
            Err(Error::DataTooLong {
                len: u64::from(MAX_DATA_LEN) + 1
            })
        );
        assert_eq!(
            Repr::read(Target::Pmem(PmemAddr(0)), AccessKey::NONE, MAX_DATA_LEN).check(),
            Ok(())
        );
        // FLUSH ranges are not bounded by the data limit.
        assert_eq!(
            Repr::flush(Target::Pmem(PmemAddr(0)), AccessKey::NONE, u32::MAX).check(),
            Ok(())
        );
    }

    #[test]
    fn operations_map_to_request_opcodes() {
        for op in Operation::ALL {
            assert!(op.opcode().is_request());
            assert_eq!(Operation::from_opcode(op.opcode()), Some(op));
        }
        assert_eq!(Operation::from_opcode(Opcode::Ping), None);
        assert_eq!(Operation::WritePersist.to_string(), "WRITE_PERSIST");
    }

    /// An ATOMIC_WRITE of 6 at offset 64 of region 2 for client 3's
    /// identity (lane 0, seq 41), recording the COMPARE_SWAP 5 -> 6 that
    /// returned 5.
    fn recorded_write(record: &[u8; RECORD_LEN]) -> Repr<'_> {
        Repr {
            on_behalf: Some(3),
            ..Repr::atomic_write(
                Target::Region(RegionOffset::new(RegionIndex(2), 64)),
                AccessKey(1),
                6,
            )
            .with_exactly_once(3, 41)
            .recording(record)
        }
    }

    fn emitted(repr: &Repr<'_>) -> Vec<u8> {
        let mut body = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut body[..]));
        body
    }

    #[test]
    fn an_atomic_write_carries_a_record_with_the_recorded_flag() {
        let record = AtomicRecord::new(Opcode::CompareSwap, 5, 6, 5).to_bytes();
        let write = recorded_write(&record);
        assert_eq!(write.check(), Ok(()));
        let body = emitted(&write);
        assert_eq!(body.len(), HEADER_LEN + RECORD_LEN);
        assert_eq!(body[0] & flags::RECORDED, flags::RECORDED);
        assert_eq!(&body[HEADER_LEN..], &record[..]);
        let parsed = parse_bytes(&body, Operation::AtomicWrite).unwrap();
        assert_eq!(parsed, write);
        assert_eq!(
            parsed.record(),
            Some(AtomicRecord::new(Opcode::CompareSwap, 5, 6, 5))
        );
        // A plain ATOMIC_WRITE has neither flag nor record.
        let plain = Repr::atomic_write(Target::Pmem(PmemAddr(64)), AccessKey(1), 6);
        assert_eq!(plain.flags() & flags::RECORDED, 0);
        assert_eq!(plain.record(), None);
    }

    #[test]
    fn a_record_must_match_its_flag_and_have_an_identity() {
        let record = AtomicRecord::new(Opcode::FetchAdd, 0, 1, 9).to_bytes();
        let body = emitted(&recorded_write(&record));
        // The flag without the record, the record without the flag.
        let mut bare = body[..HEADER_LEN].to_vec();
        assert!(matches!(
            parse_bytes(&bare, Operation::AtomicWrite),
            Err(Error::LengthMismatch {
                expected: RECORD_LEN,
                got: 0,
                ..
            })
        ));
        bare.extend_from_slice(&record);
        bare[0] &= !flags::RECORDED;
        assert!(matches!(
            parse_bytes(&bare, Operation::AtomicWrite),
            Err(Error::LengthMismatch {
                expected: 0,
                got: RECORD_LEN,
                ..
            })
        ));
        // A record with a bad operation, or no exactly-once identity.
        let mut bad = body.clone();
        bad[HEADER_LEN] = Opcode::Read.into();
        assert!(matches!(
            parse_bytes(&bad, Operation::AtomicWrite),
            Err(Error::ReservedBits { .. })
        ));
        let anonymous = Repr {
            exactly_once: None,
            on_behalf: None,
            ..recorded_write(&record)
        };
        assert!(anonymous.check().is_err());
        let mut anonymous = emitted(&anonymous);
        anonymous[0] &= !flags::EXACTLY_ONCE;
        assert!(parse_bytes(&anonymous, Operation::AtomicWrite).is_err());
    }
}
