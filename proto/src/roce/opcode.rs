//! BTH opcodes of the Reliable Connection (RC) transport and the headers each carries.
//!
//! The top three bits of an opcode name the transport (`000` = RC), the low
//! five the operation. Values are IBTA's; FLUSH and ATOMIC_WRITE come from the
//! 1.5 memory placement extensions.

use crate::code::byte_code;

/// The headers that follow the BTH for one opcode, in wire order:
/// FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, then the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// FLUSH extended transport header (4 bytes).
    pub feth: bool,
    /// RDMA extended transport header (16 bytes).
    pub reth: bool,
    /// Atomic extended transport header (28 bytes).
    pub atomic_eth: bool,
    /// ACK extended transport header (4 bytes).
    pub aeth: bool,
    /// Atomic acknowledge extended transport header (8 bytes).
    pub atomic_ack_eth: bool,
    /// Immediate data (4 bytes).
    pub immdt: bool,
    /// Invalidate extended transport header (4 bytes).
    pub ieth: bool,
    /// Whether the packet may carry a payload.
    pub payload: bool,
}

impl Layout {
    /// Bytes of extension headers after the BTH.
    pub const fn headers_len(&self) -> usize {
        let mut len = 0;
        if self.feth {
            len += super::feth::HEADER_LEN;
        }
        if self.reth {
            len += super::reth::HEADER_LEN;
        }
        if self.atomic_eth {
            len += super::atomic_eth::HEADER_LEN;
        }
        if self.aeth {
            len += super::aeth::HEADER_LEN;
        }
        if self.atomic_ack_eth {
            len += super::atomic_ack_eth::HEADER_LEN;
        }
        if self.immdt {
            len += super::immdt::HEADER_LEN;
        }
        if self.ieth {
            len += super::immdt::HEADER_LEN;
        }
        len
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $text:literal,
        [$($hdr:ident),*] ;)*) => {
        /// An RC opcode, or any other byte kept as [`Opcode::Unknown`] so it round-trips
        /// and can be answered with an invalid-request NAK instead of being misread.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( $(#[$doc])* $name, )*
            /// Any other value: another transport (UD, UC, …) or a reserved RC code.
            Unknown(u8),
        }

        byte_code!(Opcode { $($name = $value),* });

        impl Opcode {
            /// The headers after the BTH; `None` for an unknown opcode.
            pub const fn layout(self) -> Option<Layout> {
                match self {
                    $( Opcode::$name => Some(Layout { $($hdr: true,)* ..LAYOUT_NONE }), )*
                    Opcode::Unknown(_) => None,
                }
            }

            /// IBTA's name for the opcode.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Opcode::$name => $text, )*
                    Opcode::Unknown(_) => "UNKNOWN",
                }
            }
        }
    };
}

const LAYOUT_NONE: Layout = Layout {
    feth: false,
    reth: false,
    atomic_eth: false,
    aeth: false,
    atomic_ack_eth: false,
    immdt: false,
    ieth: false,
    payload: false,
};

opcodes! {
    /// First packet of a multi-packet SEND.
    SendFirst = 0x00, "SEND_FIRST", [payload];
    /// Middle packet of a SEND.
    SendMiddle = 0x01, "SEND_MIDDLE", [payload];
    /// Last packet of a SEND.
    SendLast = 0x02, "SEND_LAST", [payload];
    /// Last packet of a SEND with immediate data.
    SendLastImm = 0x03, "SEND_LAST_WITH_IMMEDIATE", [immdt, payload];
    /// A SEND in one packet.
    SendOnly = 0x04, "SEND_ONLY", [payload];
    /// A SEND with immediate data in one packet.
    SendOnlyImm = 0x05, "SEND_ONLY_WITH_IMMEDIATE", [immdt, payload];
    /// First packet of a multi-packet RDMA WRITE.
    WriteFirst = 0x06, "RDMA_WRITE_FIRST", [reth, payload];
    /// Middle packet of an RDMA WRITE.
    WriteMiddle = 0x07, "RDMA_WRITE_MIDDLE", [payload];
    /// Last packet of an RDMA WRITE.
    WriteLast = 0x08, "RDMA_WRITE_LAST", [payload];
    /// Last packet of an RDMA WRITE with immediate data.
    WriteLastImm = 0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", [immdt, payload];
    /// An RDMA WRITE in one packet.
    WriteOnly = 0x0A, "RDMA_WRITE_ONLY", [reth, payload];
    /// An RDMA WRITE with immediate data in one packet.
    WriteOnlyImm = 0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", [reth, immdt, payload];
    /// RDMA READ request.
    ReadRequest = 0x0C, "RDMA_READ_REQUEST", [reth];
    /// First packet of a multi-packet READ response.
    ReadResponseFirst = 0x0D, "RDMA_READ_RESPONSE_FIRST", [aeth, payload];
    /// Middle packet of a READ response.
    ReadResponseMiddle = 0x0E, "RDMA_READ_RESPONSE_MIDDLE", [payload];
    /// Last packet of a READ response.
    ReadResponseLast = 0x0F, "RDMA_READ_RESPONSE_LAST", [aeth, payload];
    /// A READ response in one packet (also answers FLUSH and ATOMIC_WRITE, without payload).
    ReadResponseOnly = 0x10, "RDMA_READ_RESPONSE_ONLY", [aeth, payload];
    /// Acknowledge (ACK, NAK or RNR NAK, by the AETH syndrome).
    Acknowledge = 0x11, "ACKNOWLEDGE", [aeth];
    /// Acknowledge of an atomic, with the original remote value.
    AtomicAcknowledge = 0x12, "ATOMIC_ACKNOWLEDGE", [aeth, atomic_ack_eth];
    /// 8-byte compare and swap.
    CompareSwap = 0x13, "COMPARE_SWAP", [atomic_eth];
    /// 8-byte fetch and add.
    FetchAdd = 0x14, "FETCH_ADD", [atomic_eth];
    /// Last packet of a SEND that invalidates a remote key.
    SendLastInv = 0x16, "SEND_LAST_WITH_INVALIDATE", [ieth, payload];
    /// A SEND that invalidates a remote key, in one packet.
    SendOnlyInv = 0x17, "SEND_ONLY_WITH_INVALIDATE", [ieth, payload];
    /// Makes earlier writes to a range visible or persistent (IBTA 1.5).
    Flush = 0x1C, "FLUSH", [feth, reth];
    /// An 8-byte write that is placed atomically (IBTA 1.5).
    AtomicWrite = 0x1D, "ATOMIC_WRITE", [reth, payload];
}

impl Opcode {
    /// Whether a requester sends this opcode (as opposed to a responder).
    pub const fn is_request(self) -> bool {
        !matches!(
            self,
            Opcode::ReadResponseFirst
                | Opcode::ReadResponseMiddle
                | Opcode::ReadResponseLast
                | Opcode::ReadResponseOnly
                | Opcode::Acknowledge
                | Opcode::AtomicAcknowledge
                | Opcode::Unknown(_)
        )
    }

    /// Whether this packet starts a message (FIRST or ONLY, or a one-packet request).
    pub const fn starts_message(self) -> bool {
        !matches!(
            self,
            Opcode::SendMiddle
                | Opcode::SendLast
                | Opcode::SendLastImm
                | Opcode::SendLastInv
                | Opcode::WriteMiddle
                | Opcode::WriteLast
                | Opcode::WriteLastImm
                | Opcode::ReadResponseMiddle
                | Opcode::ReadResponseLast
                | Opcode::Unknown(_)
        )
    }

    /// Whether this packet ends a message (LAST or ONLY, or a one-packet request).
    pub const fn ends_message(self) -> bool {
        !matches!(
            self,
            Opcode::SendFirst
                | Opcode::SendMiddle
                | Opcode::WriteFirst
                | Opcode::WriteMiddle
                | Opcode::ReadResponseFirst
                | Opcode::ReadResponseMiddle
                | Opcode::Unknown(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for byte in 0..=u8::MAX {
            assert_eq!(u8::from(Opcode::from(byte)), byte);
        }
    }

    #[test]
    fn ibta_values_and_layouts() {
        assert_eq!(Opcode::from(0x0C), Opcode::ReadRequest);
        assert_eq!(Opcode::from(0x1D), Opcode::AtomicWrite);
        assert_eq!(Opcode::from(0x64), Opcode::Unknown(0x64));
        let flush = Opcode::Flush.layout().unwrap();
        assert!(flush.feth && flush.reth && !flush.payload);
        assert_eq!(flush.headers_len(), 20);
        assert_eq!(
            Opcode::AtomicAcknowledge.layout().unwrap().headers_len(),
            12
        );
        assert_eq!(Opcode::WriteOnlyImm.layout().unwrap().headers_len(), 20);
        assert_eq!(Opcode::CompareSwap.layout().unwrap().headers_len(), 28);
        assert_eq!(Opcode::Unknown(0x15).layout(), None);
        assert_eq!(Opcode::FetchAdd.to_string(), "FETCH_ADD");
        assert_eq!(Opcode::Unknown(0x64).to_string(), "UNKNOWN(0x64)");
    }

    #[test]
    fn message_boundaries() {
        assert!(Opcode::WriteFirst.starts_message() && !Opcode::WriteFirst.ends_message());
        assert!(Opcode::ReadRequest.starts_message() && Opcode::ReadRequest.ends_message());
        assert!(!Opcode::SendMiddle.starts_message() && !Opcode::SendMiddle.ends_message());
        assert!(Opcode::Flush.is_request() && !Opcode::Acknowledge.is_request());
    }
}
