//! A whole RoCEv2 datagram: IPv4, UDP to port 4791, the transport packet
//! and its ICRC. The IPv4, UDP and Ethernet layers are smoltcp's views.
//!
//! Receiving checks everything a RoCEv2 endpoint checks before it looks at
//! the transport: IPv4 without options or fragmentation, the IPv4 header
//! checksum, UDP to [`UDP_PORT`] with a consistent length and (if present)
//! checksum, a well-formed transport packet, and the ICRC.

use core::fmt;
use core::net::Ipv4Addr;

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, UdpPacket,
};

use super::error::{Error, Result, truncated};
use super::{icrc, packet};

/// The UDP destination port of RoCEv2.
pub const UDP_PORT: u16 = 4791;
/// Length of the IPv4 header RoCEv2 datagrams use (no options).
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Length of an Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// The IPv4 fields a RoCEv2 sender chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpFields {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// Explicit congestion notification (2 bits).
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag (Linux sets it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
}

/// A datagram whose every layer and ICRC were checked.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Length of the whole IPv4 datagram.
    pub total_len: usize,
    /// The IPv4 fields.
    pub ip: IpFields,
    /// UDP source port (senders vary it per QP for ECMP).
    pub src_port: u16,
    /// Whether the UDP checksum was present.
    pub udp_checksum: bool,
    /// The checked transport packet.
    pub transport: packet::Packet<&'a [u8]>,
}

fn ip_err(_: smoltcp::wire::Error) -> Error {
    Error::NotRoce("malformed IPv4 header")
}

impl<'a> Datagram<'a> {
    /// Checks an IPv4 packet (from its first header byte) as a RoCEv2 datagram.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self> {
        if bytes.len() < IPV4_HEADER_LEN {
            return Err(truncated("IPv4 header", IPV4_HEADER_LEN, bytes.len()));
        }
        if bytes[0] >> 4 != 4 {
            return Err(Error::NotRoce("not IPv4"));
        }
        let ip = Ipv4Packet::new_checked(bytes).map_err(ip_err)?;
        if usize::from(ip.header_len()) != IPV4_HEADER_LEN {
            return Err(Error::NotRoce("IPv4 options present"));
        }
        if ip.more_frags() || ip.frag_offset() != 0 {
            return Err(Error::NotRoce("IPv4 fragment"));
        }
        if ip.next_header() != IpProtocol::Udp {
            return Err(Error::NotRoce("not UDP"));
        }
        if !ip.verify_checksum() {
            return Err(Error::BadIpChecksum);
        }
        let total = usize::from(ip.total_len());
        let bytes = &bytes[..total];
        let udp_bytes = &bytes[IPV4_HEADER_LEN..];
        let udp = UdpPacket::new_checked(udp_bytes)
            .map_err(|_| Error::NotRoce("malformed UDP header"))?;
        if udp.dst_port() != UDP_PORT {
            return Err(Error::NotRoce("UDP destination port is not 4791"));
        }
        if usize::from(udp.len()) != udp_bytes.len() {
            return Err(Error::NotRoce("UDP length differs from the IPv4 length"));
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let udp_checksum = udp.checksum() != 0;
        if udp_checksum && !udp.verify_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst)) {
            return Err(Error::BadUdpChecksum);
        }
        let transport = packet::Packet::new_checked(&udp_bytes[UDP_HEADER_LEN..])?;
        let computed = icrc::ipv4(&bytes[..total - packet::ICRC_LEN], IPV4_HEADER_LEN)
            .ok_or_else(|| truncated("RoCEv2 datagram", IPV4_HEADER_LEN + UDP_HEADER_LEN, total))?;
        if computed != transport.icrc() {
            return Err(Error::BadIcrc {
                carried: transport.icrc(),
                computed,
            });
        }
        Ok(Datagram {
            total_len: total,
            ip: IpFields {
                src,
                dst,
                dscp: ip.dscp(),
                ecn: ip.ecn(),
                ident: ip.ident(),
                dont_frag: ip.dont_frag(),
                ttl: ip.hop_limit(),
            },
            src_port: udp.src_port(),
            udp_checksum,
            transport,
        })
    }
}

/// The IPv4 payload of an Ethernet II frame carrying IPv4.
pub fn ethernet_payload(frame: &[u8]) -> Result<&[u8]> {
    let eth = EthernetFrame::new_checked(frame)
        .map_err(|_| truncated("Ethernet header", ETHERNET_HEADER_LEN, frame.len()))?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return Err(Error::NotRoce("Ethernet frame does not carry IPv4"));
    }
    Ok(&frame[ETHERNET_HEADER_LEN..])
}

/// A parsed RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// The IPv4 fields.
    pub ip: IpFields,
    /// UDP source port.
    pub src_port: u16,
    /// Whether to fill the UDP checksum (Linux rxe leaves it zero).
    pub udp_checksum: bool,
    /// The transport packet.
    pub transport: packet::Repr<'a>,
}

impl<'a> Repr<'a> {
    /// Parses a checked datagram.
    pub fn parse(datagram: &Datagram<'a>) -> Result<Repr<'a>> {
        Ok(Repr {
            ip: datagram.ip,
            src_port: datagram.src_port,
            udp_checksum: datagram.udp_checksum,
            transport: packet::Repr::parse(&datagram.transport)?,
        })
    }

    /// Length of the encoded IPv4 datagram.
    pub fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN + UDP_HEADER_LEN + self.transport.buffer_len()
    }

    /// Writes the datagram into a buffer of exactly [`Repr::buffer_len`]
    /// bytes, with the IPv4 checksum, the ICRC and, if asked, the UDP checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let total = self.buffer_len();
        if buf.len() != total {
            return Err(Error::Inconsistent(
                "buffer length differs from buffer_len()",
            ));
        }
        let total16 =
            u16::try_from(total).map_err(|_| Error::Inconsistent("datagram over 64 KiB"))?;
        let (head, rest) = buf.split_at_mut(IPV4_HEADER_LEN + UDP_HEADER_LEN);
        self.transport
            .emit(&mut packet::Packet::new_unchecked(&mut rest[..]))?;
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut head[..]);
            ip.set_version(4);
            ip.set_header_len(IPV4_HEADER_LEN as u8);
            ip.set_dscp(self.ip.dscp);
            ip.set_ecn(self.ip.ecn);
            ip.set_total_len(total16);
            ip.set_ident(self.ip.ident);
            ip.clear_flags();
            ip.set_dont_frag(self.ip.dont_frag);
            ip.set_frag_offset(0);
            ip.set_hop_limit(self.ip.ttl);
            ip.set_next_header(IpProtocol::Udp);
            ip.set_src_addr(self.ip.src);
            ip.set_dst_addr(self.ip.dst);
            ip.fill_checksum();
        }
        {
            let mut udp = UdpPacket::new_unchecked(&mut head[IPV4_HEADER_LEN..]);
            udp.set_src_port(self.src_port);
            udp.set_dst_port(UDP_PORT);
            udp.set_len(total16 - IPV4_HEADER_LEN as u16);
            udp.set_checksum(0);
        }
        let crc = icrc::ipv4(&buf[..total - packet::ICRC_LEN], IPV4_HEADER_LEN)
            .ok_or(Error::Inconsistent("datagram shorter than its headers"))?;
        packet::Packet::new_unchecked(&mut buf[IPV4_HEADER_LEN + UDP_HEADER_LEN..]).set_icrc(crc);
        if self.udp_checksum {
            let (src, dst) = (IpAddress::Ipv4(self.ip.src), IpAddress::Ipv4(self.ip.dst));
            UdpPacket::new_unchecked(&mut buf[IPV4_HEADER_LEN..]).fill_checksum(&src, &dst);
        }
        Ok(())
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RoCEv2 {}:{} > {} {}",
            self.ip.src, self.src_port, self.ip.dst, self.transport
        )
    }
}
