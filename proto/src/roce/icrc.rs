//! The invariant CRC (ICRC) of a RoCEv2 datagram.
//!
//! CRC-32 (the Ethernet polynomial, reflected, as `crc32fast` computes it)
//! over: eight 0xFF bytes standing for the InfiniBand LRH that RoCEv2 does
//! not carry; the IPv4 header with TOS, TTL and header checksum set to all
//! ones; the UDP header with its checksum set to all ones; the BTH with its
//! reserved byte (offset 4) set to all ones; and everything after the BTH
//! up to the ICRC. Those fields are masked because routers may change them
//! on the way. The result goes on the wire least significant byte first.

use super::bth;

const IPV4_TOS: usize = 1;
const IPV4_TTL: usize = 8;
const IPV4_CHECKSUM: core::ops::Range<usize> = 10..12;
const UDP_HEADER_LEN: usize = 8;
const UDP_CHECKSUM: core::ops::Range<usize> = 6..8;
const MASKED_LRH: [u8; 8] = [0xFF; 8];

/// The ICRC of an IPv4 RoCEv2 datagram, or `None` when `datagram` is too
/// short to hold the headers it covers.
///
/// `datagram` is the IPv4 packet from its first header byte up to, not
/// including, the ICRC; `ip_header_len` is the IPv4 header length (20 to 60).
pub fn ipv4(datagram: &[u8], ip_header_len: usize) -> Option<u32> {
    let headers = ip_header_len + UDP_HEADER_LEN + bth::HEADER_LEN;
    if !(20..=60).contains(&ip_header_len) || datagram.len() < headers {
        return None;
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&MASKED_LRH);

    let mut ip = [0u8; 60];
    let ip = &mut ip[..ip_header_len];
    ip.copy_from_slice(&datagram[..ip_header_len]);
    ip[IPV4_TOS] = 0xFF;
    ip[IPV4_TTL] = 0xFF;
    ip[IPV4_CHECKSUM].fill(0xFF);
    hasher.update(ip);

    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(&datagram[ip_header_len..ip_header_len + UDP_HEADER_LEN]);
    udp[UDP_CHECKSUM].fill(0xFF);
    hasher.update(&udp);

    let bth_at = ip_header_len + UDP_HEADER_LEN;
    let mut bth = [0u8; bth::HEADER_LEN];
    bth.copy_from_slice(&datagram[bth_at..bth_at + bth::HEADER_LEN]);
    bth[bth::field::RESV8A] = 0xFF;
    hasher.update(&bth);

    hasher.update(&datagram[bth_at + bth::HEADER_LEN..]);
    Some(hasher.finalize())
}

/// The ICRC Linux rxe (through at least 6.12) computes for a FLUSH: its
/// opcode table gives FLUSH no payload offset, so after the headers it
/// covers the transport headers a second time, unmasked, as if they were
/// the payload. rxe drops a FLUSH carrying the [`ipv4`] ICRC without a
/// word; a requester talking to rxe sends this one instead.
pub fn ipv4_rxe_flush(datagram: &[u8], ip_header_len: usize) -> Option<u32> {
    let bth_at = ip_header_len + UDP_HEADER_LEN;
    let mut both = Vec::with_capacity(datagram.len() + datagram.len().saturating_sub(bth_at));
    both.extend_from_slice(datagram);
    both.extend_from_slice(datagram.get(bth_at..)?);
    ipv4(&both, ip_header_len)
}

#[cfg(test)]
mod tests {
    #[test]
    fn short_or_odd_input_has_no_icrc() {
        assert_eq!(super::ipv4(&[0u8; 39], 20), None);
        assert_eq!(super::ipv4(&[0u8; 100], 19), None);
        assert_eq!(super::ipv4(&[0u8; 100], 61), None);
        assert!(super::ipv4(&[0u8; 40], 20).is_some());
    }
}
