#!/usr/bin/env python3
"""RoCEv2 packets checked with scapy, whose ICRC code is independent of ours.

  scapy_roce.py build   prints "NAME HEX" lines: Ethernet frames scapy built
                        as Ether()/IP()/UDP(dport=4791)/BTH()/headers/payload,
                        with scapy computing the ICRC (and, where asked, the
                        IPv4 and UDP checksums and lengths)
  scapy_roce.py check   reads "NAME OPCODE HEX" lines of IPv4 datagrams
                        pmem-fabric built, dissects each with scapy, rebuilds
                        it with the ICRC, the checksums and the lengths left
                        for scapy to compute, and prints "ok N" or one line
                        per disagreement (exit 1)

scapy.contrib.roce has BTH (its FCS field `icrc` is the ICRC, computed in
BTH.post_build when None) and AETH (bound after opcode 0x11 only). It has
no RETH, AtomicETH, AtomicAckETH, ImmDt, IETH or FETH, and its opcode table
stops at FETCH_ADD (0x14): no SEND_*_WITH_INVALIDATE (0x16, 0x17), FLUSH
(0x1C) or ATOMIC_WRITE (0x1D). The missing headers are defined below from
IBTA's layouts; for opcodes scapy does not name, the BTH still takes the
number and the ICRC is computed over whatever bytes follow it, so those
packets are checked the same way, with the headers after the BTH as raw
bytes.
"""
import sys

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw


class RETH(Packet):
    """RDMA extended transport header (16 bytes)."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]


class AtomicETH(Packet):
    """Atomic extended transport header (28 bytes)."""

    name = "AtomicETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        XLongField("swapdt", 0),
        XLongField("cmpdt", 0),
    ]


class AtomicAckETH(Packet):
    """Atomic acknowledge extended transport header (8 bytes)."""

    name = "AtomicAckETH"
    fields_desc = [XLongField("orig", 0)]


class ImmDt(Packet):
    """Immediate data (4 bytes)."""

    name = "ImmDt"
    fields_desc = [XIntField("data", 0)]


class IETH(Packet):
    """Invalidate extended transport header (4 bytes)."""

    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]


class FETH(Packet):
    """FLUSH extended transport header (IBTA 1.5, 4 bytes)."""

    name = "FETH"
    fields_desc = [
        BitField("reserved", 0, 26),
        BitField("sel", 0, 2),
        BitField("plt", 0, 4),
    ]


SRC_MAC = "52:54:00:77:00:02"
DST_MAC = "52:54:00:77:00:01"


def frame(opcode, psn, headers=None, payload=b"", *, ackreq=1, solicited=0,
          tos=0, udp_checksum=False):
    """One Ethernet frame: a datagram from 10.77.0.2 to QP 0x11 at 10.77.0.1."""
    pad = (4 - len(payload) % 4) % 4
    packet = (
        Ether(src=SRC_MAC, dst=DST_MAC)
        / IP(src="10.77.0.2", dst="10.77.0.1", tos=tos, flags="DF", id=100 + psn, ttl=64)
        / UDP(sport=49441, dport=4791, chksum=None if udp_checksum else 0)
        / BTH(opcode=opcode, solicited=solicited, padcount=pad, pkey=0xFFFF,
              dqpn=0x11, ackreq=ackreq, psn=psn)
    )
    for header in headers or []:
        packet = packet / header
    if payload or pad:
        packet = packet / Raw(payload + b"\x00" * pad)
    return bytes(packet)


def build():
    reth_read = RETH(va=0x5555_0000_1000, rkey=0x2BE, dlen=4096)
    packets = {
        "read_request": frame(0x0C, 1, [reth_read]),
        "write_only": frame(0x0A, 2, [RETH(va=0x5555_0000_1000, rkey=0x2BE, dlen=5)], b"hello"),
        "write_only_imm": frame(
            0x0B, 3, [RETH(va=0x5555_0000_1040, rkey=0x2BE, dlen=6), ImmDt(data=0xBEEF)], b"imm!!!"
        ),
        "send_only": frame(0x04, 4, payload=b"odd-length!", solicited=1),
        "send_only_udp_checksum": frame(0x04, 5, payload=b"with a UDP checksum", udp_checksum=True),
        "send_only_inv": frame(0x17, 6, [IETH(rkey=0x1234)], b"inv"),
        "compare_swap": frame(
            0x13, 7, [AtomicETH(va=0x5555_0000_2000, rkey=0x2BE, swapdt=9, cmpdt=7)]
        ),
        "fetch_add": frame(
            0x14, 8, [AtomicETH(va=0x5555_0000_2008, rkey=0x2BE, swapdt=1, cmpdt=0)], tos=0x68 | 0x2
        ),
        "flush": frame(
            0x1C, 9, [FETH(sel=0, plt=2), RETH(va=0x5555_0000_1000, rkey=0x2BE, dlen=64)]
        ),
        "atomic_write": frame(
            0x1D, 10, [RETH(va=0x5555_0000_3000, rkey=0x2BE, dlen=8)], bytes(range(1, 9))
        ),
        "ack": frame(0x11, 11, [AETH(syndrome=0x1F, msn=3)], ackreq=0),
        "nak_sequence": frame(0x11, 12, [AETH(syndrome=0x60, msn=3)], ackreq=0),
        "rnr_nak": frame(0x11, 13, [AETH(syndrome=0x20 | 14, msn=3)], ackreq=0),
        "atomic_ack": frame(
            0x12, 14, [AETH(syndrome=0x1F, msn=4), AtomicAckETH(orig=0x0102_0304_0506_0708)], ackreq=0
        ),
        "read_response_only": frame(0x10, 15, [AETH(syndrome=0x1F, msn=5)], bytes(range(61)), ackreq=0),
        "read_response_middle": frame(0x0E, 16, payload=bytes(range(256)) * 4, ackreq=0),
    }
    for name, data in packets.items():
        print(name, data.hex())


def check():
    bad = []
    count = 0
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            name, opcode, hexdata = line.split()
            opcode = int(opcode)
            data = bytes.fromhex(hexdata)
        except ValueError:
            bad.append(f"line {number}: expected NAME OPCODE HEX")
            continue
        count += 1
        before = len(bad)
        packet = IP(data)
        if UDP not in packet or BTH not in packet:
            bad.append(f"{name}: scapy sees no UDP/BTH in {packet.summary()}")
            continue
        if packet[BTH].opcode != opcode:
            bad.append(f"{name}: scapy reads opcode {packet[BTH].opcode}, expected {opcode}")
        # Everything scapy computes is left for it to compute again.
        packet[IP].len = None
        packet[IP].chksum = None
        packet[UDP].len = None
        if packet[UDP].chksum != 0:
            packet[UDP].chksum = None
        packet[BTH].icrc = None
        again = bytes(packet)
        for what, span in [
            ("IPv4 total length", slice(2, 4)),
            ("IPv4 header checksum", slice(10, 12)),
            ("UDP length", slice(24, 26)),
            ("UDP checksum", slice(26, 28)),
            ("ICRC", slice(len(data) - 4, len(data))),
        ]:
            if again[span] != data[span]:
                bad.append(f"{name}: {what} ours {data[span].hex()} scapy {again[span].hex()}")
        if again != data and len(bad) == before:
            bad.append(f"{name}: scapy rebuilds other bytes\n  ours  {data.hex()}\n  scapy {again.hex()}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"ok {count}")


if __name__ == "__main__":
    modes = {"build": build, "check": check}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        sys.exit(f"usage: {sys.argv[0]} build|check")
    modes[sys.argv[1]]()
