//! Frame opcodes.
//!
//! Data-path operations reuse the IBTA reliable-connection opcode numbers
//! (Linux `include/rdma/ib_pack.h`, `IB_OPCODE_*` with the RC prefix 0x00), so
//! a RoCEv2 gateway can translate them one to one. Operations and control
//! messages without an IBTA number use the manufacturer-specific range
//! (0xC0..=0xFF).

use crate::code::byte_code;

/// What an opcode is: the columns of the table below.
#[derive(Debug, Clone, Copy, Default)]
struct Class {
    /// One of the seven one-sided request operations.
    request: bool,
    /// An answer to a request.
    response: bool,
    /// An 8-byte atomic.
    atomic: bool,
    /// A listener receives it from the peer that connected to it.
    to_listener: bool,
}

const NO_CLASS: Class = Class {
    request: false,
    response: false,
    atomic: false,
    to_listener: false,
};

/// Defines [`Opcode`] from one line per operation: its variant, wire value,
/// name and class; the conversions and `Display` (`byte_code!`),
/// [`Opcode::ALL`], [`Opcode::name`] and the class tests all follow from
/// that line.
macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $text:literal, [$($class:ident),*]; )*) => {
        /// The operation or message kind of a frame (header byte 3).
        ///
        /// Unknown values are kept in [`Opcode::Unknown`] so they round-trip and can be
        /// answered with `UNSUPPORTED`. `Opcode::from(u8)` never yields `Unknown` for a
        /// value that has a named variant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $(
                $(#[$doc])*
                #[doc = concat!("\n\n`", $text, "` = ", stringify!($value), ".")]
                $name,
            )*
            /// Any other value.
            Unknown(u8),
        }

        impl Opcode {
            /// Every named opcode, in numeric order.
            pub const ALL: [Opcode; [$($text),*].len()] = [$(Opcode::$name),*];

            /// The name used in logs and metrics, e.g. `"WRITE_PERSIST"`; `"UNKNOWN"`
            /// for unknown values (whose `Display` adds the number: `UNKNOWN(0x42)`).
            pub fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $text, )*
                    Opcode::Unknown(_) => "UNKNOWN",
                }
            }

            const fn class(self) -> Class {
                match self {
                    $( Opcode::$name => Class { $($class: true,)* ..NO_CLASS }, )*
                    Opcode::Unknown(_) => NO_CLASS,
                }
            }
        }

        byte_code!(Opcode { $($name = $value),* });
    };
}

opcodes! {
    /// One-sided write (IBTA RDMA_WRITE_ONLY).
    Write = 0x0A, "WRITE", [request, to_listener];
    /// One-sided read request (IBTA RDMA_READ_REQUEST).
    Read = 0x0C, "READ", [request, to_listener];
    /// Data answering a [`Opcode::Read`] (IBTA RDMA_READ_RESPONSE_ONLY).
    ReadResponse = 0x10, "READ_RESPONSE", [response];
    /// Status-only answer (IBTA ACKNOWLEDGE).
    Acknowledge = 0x11, "ACKNOWLEDGE", [response];
    /// Answer to an atomic carrying the old value (IBTA ATOMIC_ACKNOWLEDGE).
    AtomicAcknowledge = 0x12, "ATOMIC_ACKNOWLEDGE", [response];
    /// 8-byte compare-and-swap (IBTA COMPARE_SWAP).
    CompareSwap = 0x13, "COMPARE_SWAP", [request, atomic, to_listener];
    /// 8-byte fetch-and-add (IBTA FETCH_ADD).
    FetchAdd = 0x14, "FETCH_ADD", [request, atomic, to_listener];
    /// Make a range durable (IBTA FLUSH).
    Flush = 0x1C, "FLUSH", [request, to_listener];
    /// 8-byte atomic store (IBTA ATOMIC_WRITE).
    AtomicWrite = 0x1D, "ATOMIC_WRITE", [request, atomic, to_listener];
    /// Write acknowledged only once durable (no IBTA number).
    WritePersist = 0xC0, "WRITE_PERSIST", [request, to_listener];
    /// Connection handshake: version, role, capabilities, name; the
    /// listener answers with its own.
    Hello = 0xE0, "HELLO", [to_listener];
    /// Ask for the address map.
    MapRequest = 0xE1, "MAP_REQUEST", [to_listener];
    /// The address map.
    Map = 0xE2, "MAP", [];
    /// Liveness probe.
    Ping = 0xE3, "PING", [to_listener];
    /// Answer to [`Opcode::Ping`].
    Pong = 0xE4, "PONG", [];
    /// Set up a RoCEv2 queue pair: the client's end.
    QpConnect = 0xE5, "QP_CONNECT", [to_listener];
    /// The device's end of a new queue pair and its R_Keys.
    QpAccept = 0xE6, "QP_ACCEPT", [];
    /// The listener's challenge to prove the connecting principal.
    AuthChallenge = 0xE7, "AUTH_CHALLENGE", [];
    /// A proof of knowing the principal's key (the listener answers with
    /// its own).
    AuthProof = 0xE8, "AUTH_PROOF", [to_listener];
    /// An operator's order to replace a region's key.
    RotateKey = 0xE9, "ROTATE_KEY", [to_listener];
    /// An operator's order to check a region's blocks against their
    /// checksums.
    Scrub = 0xEA, "SCRUB", [to_listener];
    /// What a [`Opcode::Scrub`] found.
    ScrubReport = 0xEB, "SCRUB_REPORT", [];
    /// The epoch of the cluster map the sender runs from now on on this
    /// connection; answered with an ACKNOWLEDGE carrying the listener's.
    MapEpoch = 0xEC, "MAP_EPOCH", [to_listener];
    /// An operator's or a fabric device's request for the checksums of a
    /// run of a region copy's blocks as they are now.
    BlockSums = 0xED, "BLOCK_SUMS", [to_listener];
    /// The checksums a [`Opcode::BlockSums`] asked for.
    BlockSumsReport = 0xEE, "BLOCK_SUMS_REPORT", [];
}

impl Opcode {
    /// Whether this is one of the seven one-sided request operations.
    pub fn is_request(self) -> bool {
        self.class().request
    }

    /// Whether this answers a request (READ response, ACK, atomic ACK).
    pub fn is_response(self) -> bool {
        self.class().response
    }

    /// Whether this is an 8-byte atomic operation.
    pub fn is_atomic(self) -> bool {
        self.class().atomic
    }

    /// Whether a listener (a fabric device or a server) receives this from
    /// the peer that connected to it: the requests, HELLO, MAP_REQUEST,
    /// PING, QP_CONNECT, AUTH_PROOF, ROTATE_KEY, SCRUB, MAP_EPOCH and
    /// BLOCK_SUMS.
    ///
    /// The rest only a listener sends, as answers (responses, MAP, PONG,
    /// QP_ACCEPT, AUTH_CHALLENGE, SCRUB_REPORT, BLOCK_SUMS_REPORT); a
    /// listener that receives one has no one to answer and drops it. HELLO and AUTH_PROOF go both ways.
    /// An unknown opcode is not one a listener receives.
    pub fn listener_receives(self) -> bool {
        self.class().to_listener
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
                "SCRUB",
                "MAP_EPOCH",
                "BLOCK_SUMS"
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
