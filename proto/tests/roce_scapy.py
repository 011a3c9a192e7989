#!/usr/bin/env python3
"""RoCEv2 packets checked with scapy, whose ICRC code is independent of ours.

  roce_scapy.py build   prints "NAME HEX" lines: IPv4 datagrams scapy built
                        (BTH and AETH are scapy layers, scapy appends the ICRC)
  roce_scapy.py check   reads "NAME HEX" lines of datagrams pmem-fabric built,
                        recomputes each ICRC with scapy, prints "ok N" or the
                        mismatches (exit 1)
"""
import struct
import sys

from scapy.all import IP, UDP, Raw
from scapy.contrib.roce import AETH, BTH


def datagram(opcode, *, psn, headers=b"", aeth=None, payload=b"", ackreq=0):
    pad = (4 - len(payload) % 4) % 4
    bth = BTH(opcode=opcode, dqpn=0x11, ackreq=ackreq, psn=psn, padcount=pad)
    layers = IP(src="10.77.0.2", dst="10.77.0.1", flags="DF", id=100 + psn) / UDP(
        sport=49441, dport=4791, chksum=0
    ) / bth
    if aeth is not None:
        layers = layers / AETH(syndrome=aeth[0], msn=aeth[1])
    return bytes(layers / Raw(headers + payload + b"\x00" * pad))


def build():
    reth = struct.pack(">QII", 0x5555_0000_1000, 0x2BE, 64)
    atomic = struct.pack(">QIQQ", 0x5555_0000_2000, 0x2BE, 9, 7)
    packets = {
        "read_request": datagram(0x0C, psn=1, headers=reth, ackreq=1),
        "write_only": datagram(
            0x0A, psn=2, headers=struct.pack(">QII", 0x5555_0000_1000, 0x2BE, 5), payload=b"hello", ackreq=1
        ),
        "send_only": datagram(0x04, psn=3, payload=b"odd-length", ackreq=1),
        "compare_swap": datagram(0x13, psn=4, headers=atomic, ackreq=1),
        "fetch_add": datagram(0x14, psn=5, headers=atomic, ackreq=1),
        "ack": datagram(0x11, psn=6, aeth=(0x1F, 3)),
        "nak_sequence": datagram(0x11, psn=7, aeth=(0x60, 3)),
        "atomic_ack": datagram(0x12, psn=8, aeth=(0x1F, 4), headers=struct.pack(">Q", 0x0102030405060708)),
        "read_response_only": datagram(0x10, psn=9, aeth=(0x1F, 5), payload=bytes(range(64))),
    }
    for name, data in packets.items():
        print(name, data.hex())


def check():
    bad = []
    count = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        name, hexdata = line.split()
        data = bytes.fromhex(hexdata)
        packet = IP(data)
        if BTH not in packet:
            bad.append(f"{name}: scapy sees no BTH")
            continue
        carried = data[-4:]
        packet[BTH].icrc = None
        again = bytes(packet)
        if again[-4:] != carried or again != data:
            bad.append(f"{name}: ICRC ours {carried.hex()} scapy {again[-4:].hex()}")
        count += 1
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"ok {count}")


if __name__ == "__main__":
    {"build": build, "check": check}[sys.argv[1]]()
