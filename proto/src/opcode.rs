//! Frame opcodes.
//!
//! Data-path operations reuse the IBTA reliable-connection opcode numbers
//! (Linux `include/rdma/ib_pack.h`, `IB_OPCODE_*` with the RC prefix 0x00), so
//! a RoCEv2 gateway can translate them one to one. Operations and control
//! messages without an IBTA number use the manufacturer-specific range
//! (0xC0..=0xFF).

use core::fmt;

/// The operation or message kind of a frame (header byte 3).
///
/// Unknown values are kept in [`Opcode::Unknown`] so they round-trip and can be
/// answered with `UNSUPPORTED`. `Opcode::from(u8)` never yields `Unknown` for a
/// value that has a named variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// One-sided write (IBTA RDMA_WRITE_ONLY, 0x0A).
    Write,
    /// One-sided read request (IBTA RDMA_READ_REQUEST, 0x0C).
    Read,
    /// Data answering a [`Opcode::Read`] (IBTA RDMA_READ_RESPONSE_ONLY, 0x10).
    ReadResponse,
    /// Status-only answer (IBTA ACKNOWLEDGE, 0x11).
    Acknowledge,
    /// Answer to an atomic carrying the old value (IBTA ATOMIC_ACKNOWLEDGE, 0x12).
    AtomicAcknowledge,
    /// 8-byte compare-and-swap (IBTA COMPARE_SWAP, 0x13).
    CompareSwap,
    /// 8-byte fetch-and-add (IBTA FETCH_ADD, 0x14).
    FetchAdd,
    /// Make a range durable (IBTA FLUSH, 0x1C).
    Flush,
    /// 8-byte atomic store (IBTA ATOMIC_WRITE, 0x1D).
    AtomicWrite,
    /// Write acknowledged only once durable (0xC0, no IBTA number).
    WritePersist,
    /// Connection handshake: version, role, capabilities, name (0xE0).
    Hello,
    /// Ask for the address map (0xE1).
    MapRequest,
    /// The address map (0xE2).
    Map,
    /// Liveness probe (0xE3).
    Ping,
    /// Answer to [`Opcode::Ping`] (0xE4).
    Pong,
    /// Set up a RoCEv2 queue pair: the client's end (0xE5).
    QpConnect,
    /// The device's end of a new queue pair and its R_Keys (0xE6).
    QpAccept,
    /// The listener's challenge to prove the connecting principal (0xE7).
    AuthChallenge,
    /// A proof of knowing the principal's key (0xE8).
    AuthProof,
    /// An operator's order to replace a region's key (0xE9).
    RotateKey,
    /// An operator's order to check a region's blocks against their
    /// checksums (0xEA).
    Scrub,
    /// What a [`Opcode::Scrub`] found (0xEB).
    ScrubReport,
    /// Any other value.
    Unknown(u8),
}

impl Opcode {
    /// Every named opcode, in numeric order.
    pub const ALL: [Opcode; 22] = [
        Opcode::Write,
        Opcode::Read,
        Opcode::ReadResponse,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::Flush,
        Opcode::AtomicWrite,
        Opcode::WritePersist,
        Opcode::Hello,
        Opcode::MapRequest,
        Opcode::Map,
        Opcode::Ping,
        Opcode::Pong,
        Opcode::QpConnect,
        Opcode::QpAccept,
        Opcode::AuthChallenge,
        Opcode::AuthProof,
        Opcode::RotateKey,
        Opcode::Scrub,
        Opcode::ScrubReport,
    ];

    /// Whether this is one of the seven one-sided request operations.
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Opcode::Write
                | Opcode::Read
                | Opcode::CompareSwap
                | Opcode::FetchAdd
                | Opcode::Flush
                | Opcode::AtomicWrite
                | Opcode::WritePersist
        )
    }

    /// Whether this answers a request (READ response, ACK, atomic ACK).
    pub fn is_response(self) -> bool {
        matches!(
            self,
            Opcode::ReadResponse | Opcode::Acknowledge | Opcode::AtomicAcknowledge
        )
    }

    /// Whether this is an 8-byte atomic operation.
    pub fn is_atomic(self) -> bool {
        matches!(
            self,
            Opcode::CompareSwap | Opcode::FetchAdd | Opcode::AtomicWrite
        )
    }

    /// Whether a listener (a fabric device or a server) receives this from
    /// the peer that connected to it: the requests, HELLO, MAP_REQUEST,
    /// PING, QP_CONNECT, AUTH_PROOF, ROTATE_KEY and SCRUB.
    ///
    /// The rest only a listener sends, as answers (responses, MAP, PONG,
    /// QP_ACCEPT, AUTH_CHALLENGE, SCRUB_REPORT); a listener that receives one
    /// has no one to answer and drops it. HELLO and AUTH_PROOF go both ways.
    /// An unknown opcode is not one a listener receives.
    pub fn listener_receives(self) -> bool {
        self.is_request()
            || matches!(
                self,
                Opcode::Hello
                    | Opcode::MapRequest
                    | Opcode::Ping
                    | Opcode::QpConnect
                    | Opcode::AuthProof
                    | Opcode::RotateKey
                    | Opcode::Scrub
            )
    }

    /// The opcode of the response to a frame with this opcode.
    ///
    /// READ is answered by READ_RESPONSE, COMPARE_SWAP and FETCH_ADD by
    /// ATOMIC_ACKNOWLEDGE (it carries the old value), everything else —
    /// including ATOMIC_WRITE, errors to control messages and unknown opcodes —
    /// by ACKNOWLEDGE.
    pub fn response_opcode(self) -> Opcode {
        match self {
            Opcode::Read => Opcode::ReadResponse,
            Opcode::CompareSwap | Opcode::FetchAdd => Opcode::AtomicAcknowledge,
            _ => Opcode::Acknowledge,
        }
    }

    /// The name used in logs and metrics, e.g. `"WRITE_PERSIST"`; `"UNKNOWN"`
    /// for unknown values (whose `Display` adds the number: `UNKNOWN(0x42)`).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Write => "WRITE",
            Opcode::Read => "READ",
            Opcode::ReadResponse => "READ_RESPONSE",
            Opcode::Acknowledge => "ACKNOWLEDGE",
            Opcode::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            Opcode::CompareSwap => "COMPARE_SWAP",
            Opcode::FetchAdd => "FETCH_ADD",
            Opcode::Flush => "FLUSH",
            Opcode::AtomicWrite => "ATOMIC_WRITE",
            Opcode::WritePersist => "WRITE_PERSIST",
            Opcode::Hello => "HELLO",
            Opcode::MapRequest => "MAP_REQUEST",
            Opcode::Map => "MAP",
            Opcode::Ping => "PING",
            Opcode::Pong => "PONG",
            Opcode::QpConnect => "QP_CONNECT",
            Opcode::QpAccept => "QP_ACCEPT",
            Opcode::AuthChallenge => "AUTH_CHALLENGE",
            Opcode::AuthProof => "AUTH_PROOF",
            Opcode::RotateKey => "ROTATE_KEY",
            Opcode::Scrub => "SCRUB",
            Opcode::ScrubReport => "SCRUB_REPORT",
            Opcode::Unknown(_) => "UNKNOWN",
        }
    }
}

impl From<u8> for Opcode {
    fn from(value: u8) -> Self {
        match value {
            0x0A => Opcode::Write,
            0x0C => Opcode::Read,
            0x10 => Opcode::ReadResponse,
            0x11 => Opcode::Acknowledge,
            0x12 => Opcode::AtomicAcknowledge,
            0x13 => Opcode::CompareSwap,
            0x14 => Opcode::FetchAdd,
            0x1C => Opcode::Flush,
            0x1D => Opcode::AtomicWrite,
            0xC0 => Opcode::WritePersist,
            0xE0 => Opcode::Hello,
            0xE1 => Opcode::MapRequest,
            0xE2 => Opcode::Map,
            0xE3 => Opcode::Ping,
            0xE4 => Opcode::Pong,
            0xE5 => Opcode::QpConnect,
            0xE6 => Opcode::QpAccept,
            0xE7 => Opcode::AuthChallenge,
            0xE8 => Opcode::AuthProof,
            0xE9 => Opcode::RotateKey,
            0xEA => Opcode::Scrub,
            0xEB => Opcode::ScrubReport,
            other => Opcode::Unknown(other),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(value: Opcode) -> Self {
        match value {
            Opcode::Write => 0x0A,
            Opcode::Read => 0x0C,
            Opcode::ReadResponse => 0x10,
            Opcode::Acknowledge => 0x11,
            Opcode::AtomicAcknowledge => 0x12,
            Opcode::CompareSwap => 0x13,
            Opcode::FetchAdd => 0x14,
            Opcode::Flush => 0x1C,
            Opcode::AtomicWrite => 0x1D,
            Opcode::WritePersist => 0xC0,
            Opcode::Hello => 0xE0,
            Opcode::MapRequest => 0xE1,
            Opcode::Map => 0xE2,
            Opcode::Ping => 0xE3,
            Opcode::Pong => 0xE4,
            Opcode::QpConnect => 0xE5,
            Opcode::QpAccept => 0xE6,
            Opcode::AuthChallenge => 0xE7,
            Opcode::AuthProof => 0xE8,
            Opcode::RotateKey => 0xE9,
            Opcode::Scrub => 0xEA,
            Opcode::ScrubReport => 0xEB,
            Opcode::Unknown(other) => other,
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(v) => write!(f, "UNKNOWN({v:#04x})"),
            known => f.write_str(known.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibta_numbers() {
        // Values from Linux include/rdma/ib_pack.h (RC transport, prefix 0x00).
        let expected: [(Opcode, u8); 9] = [
            (Opcode::Write, 0x0A),
            (Opcode::Read, 0x0C),
            (Opcode::ReadResponse, 0x10),
            (Opcode::Acknowledge, 0x11),
            (Opcode::AtomicAcknowledge, 0x12),
            (Opcode::CompareSwap, 0x13),
            (Opcode::FetchAdd, 0x14),
            (Opcode::Flush, 0x1C),
            (Opcode::AtomicWrite, 0x1D),
        ];
        for (op, value) in expected {
            assert_eq!(u8::from(op), value, "{op}");
            assert_eq!(Opcode::from(value), op);
        }
    }

    #[test]
    fn every_byte_round_trips() {
        for value in 0..=u8::MAX {
            let op = Opcode::from(value);
            assert_eq!(u8::from(op), value);
            assert_eq!(
                matches!(op, Opcode::Unknown(_)),
                !Opcode::ALL.contains(&op),
                "{value:#04x}"
            );
        }
    }

    #[test]
    fn classes() {
        let requests: Vec<_> = Opcode::ALL.into_iter().filter(|o| o.is_request()).collect();
        assert_eq!(requests.len(), 7);
        let responses: Vec<_> = Opcode::ALL
            .into_iter()
            .filter(|o| o.is_response())
            .collect();
        assert_eq!(
            responses,
            [
                Opcode::ReadResponse,
                Opcode::Acknowledge,
                Opcode::AtomicAcknowledge
            ]
        );
        assert!(Opcode::AtomicWrite.is_atomic());
        assert!(!Opcode::Write.is_atomic());
        assert!(!Opcode::Unknown(0x99).is_request());
    }

    #[test]
    fn what_a_listener_receives() {
        let received: Vec<_> = Opcode::ALL
            .into_iter()
            .filter(|o| o.listener_receives())
            .map(Opcode::name)
            .collect();
        assert_eq!(
            received,
            [
                "WRITE",
                "READ",
                "COMPARE_SWAP",
                "FETCH_ADD",
                "FLUSH",
                "ATOMIC_WRITE",
                "WRITE_PERSIST",
                "HELLO",
                "MAP_REQUEST",
                "PING",
                "QP_CONNECT",
                "AUTH_PROOF",
                "ROTATE_KEY",
                "SCRUB"
            ]
        );
        assert!(!Opcode::Unknown(0x77).listener_receives());
    }

    #[test]
    fn response_opcodes() {
        assert_eq!(Opcode::Read.response_opcode(), Opcode::ReadResponse);
        assert_eq!(
            Opcode::CompareSwap.response_opcode(),
            Opcode::AtomicAcknowledge
        );
        assert_eq!(
            Opcode::FetchAdd.response_opcode(),
            Opcode::AtomicAcknowledge
        );
        assert_eq!(Opcode::AtomicWrite.response_opcode(), Opcode::Acknowledge);
        assert_eq!(Opcode::WritePersist.response_opcode(), Opcode::Acknowledge);
        assert_eq!(Opcode::Hello.response_opcode(), Opcode::Acknowledge);
        assert_eq!(Opcode::Unknown(0x77).response_opcode(), Opcode::Acknowledge);
    }

    #[test]
    fn display() {
        assert_eq!(Opcode::Read.to_string(), "READ");
        assert_eq!(Opcode::WritePersist.to_string(), "WRITE_PERSIST");
        assert_eq!(Opcode::Unknown(0x42).to_string(), "UNKNOWN(0x42)");
    }
}
