//! The XDP program that hands a port's RoCEv2 frames to its `AF_XDP`
//! socket, the `XSKMAP` it redirects through, and the link that attaches
//! it to the interface, made with the `bpf` system call alone.
//!
//! The program is twenty-three instructions written out here: frames of IPv4
//! (no options) to UDP port 4791 and the port's address are redirected to
//! the socket in the map's slot for the receive queue they arrived on;
//! everything else (ARP above all) and frames of a queue with no socket go
//! on to the kernel, where the port's packet socket still sees them. The
//! link is a file descriptor: when the device exits, however it exits, the
//! kernel detaches the program.

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `enum bpf_cmd` values used here.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_MAP_TYPE_XSKMAP`.
const MAP_TYPE_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_XDP`.
const PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP` of `enum bpf_attach_type`.
const ATTACH_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE`: the generic hook, after the driver built an skb.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: the driver's own hook.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_PASS`.
const XDP_PASS: i32 = 2;
/// The `bpf_redirect_map` helper.
const HELPER_REDIRECT_MAP: i32 = 51;
/// `BPF_PSEUDO_MAP_FD`: a 64-bit immediate that names a map by descriptor.
const PSEUDO_MAP_FD: u8 = 1;
/// The RoCEv2 UDP port.
const ROCE_PORT: u16 = 4791;
/// Slots of the socket map: receive queues a port may bind.
const MAP_SLOTS: u32 = 64;
/// Bytes of verifier log kept when the kernel refuses the program.
const LOG_BYTES: usize = 16 << 10;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// Destination register in the low nibble, source in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes (class | size or operation | source).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const JGT_X: u8 = 0x2d;
/// A 32-bit compare with an immediate (`BPF_JMP32 | BPF_JNE | BPF_K`), so
/// that an immediate with its top bit set is not sign-extended.
const JNE32_K: u8 = 0x56;
const LD_DW_IMM: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

/// Bytes of a frame the program reads: Ethernet (14), IPv4 without options
/// (20), and the UDP header up to its destination port.
const HEADERS: i32 = 38;

/// The program for a port at `ip`, redirecting through map `map`.
fn instructions(map: RawFd, ip: Ipv4Addr) -> Vec<Insn> {
    // Fields compared as the program loads them: in the host's order from
    // the frame's bytes.
    let ethertype = i32::from(u16::from_ne_bytes(0x0800u16.to_be_bytes()));
    let port = i32::from(u16::from_ne_bytes(ROCE_PORT.to_be_bytes()));
    let dst_ip = i32::from_ne_bytes(ip.octets());
    // Jumps count from the next instruction to `PASS`, the pass-on block.
    const PASS: i16 = 21;
    let to_pass = |at: i16| PASS - at - 1;
    vec![
        // 0: r2 = ctx->data, r3 = ctx->data_end
        insn(LDX_W, 2, 1, 0, 0),
        insn(LDX_W, 3, 1, 4, 0),
        // 2: if data + HEADERS > data_end: pass on
        insn(MOV64_X, 4, 2, 0, 0),
        insn(ADD64_K, 4, 0, 0, HEADERS),
        insn(JGT_X, 4, 3, to_pass(4), 0),
        // 5: EtherType IPv4, version 4 with a 20-byte header, protocol UDP
        insn(LDX_H, 5, 2, 12, 0),
        insn(JNE32_K, 5, 0, to_pass(6), ethertype),
        insn(LDX_B, 5, 2, 14, 0),
        insn(JNE32_K, 5, 0, to_pass(8), 0x45),
        insn(LDX_B, 5, 2, 23, 0),
        insn(JNE32_K, 5, 0, to_pass(10), 17),
        // 11: to this port's address, UDP port 4791
        insn(LDX_W, 5, 2, 30, 0),
        insn(JNE32_K, 5, 0, to_pass(12), dst_ip),
        insn(LDX_H, 5, 2, 36, 0),
        insn(JNE32_K, 5, 0, to_pass(14), port),
        // 15: return bpf_redirect_map(map, ctx->rx_queue_index, XDP_PASS)
        insn(LDX_W, 2, 1, 16, 0),
        insn(LD_DW_IMM, 1, PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_K, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
        // 21 (PASS): return XDP_PASS
        insn(MOV64_K, 0, 0, 0, XDP_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// Why the program could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// The socket map could not be made (no CAP_BPF, or no `AF_XDP`).
    #[error("creating the XSKMAP refused")]
    Map(#[source] io::Error),
    /// The verifier refused the program; its log follows.
    #[error("loading the XDP program refused{}", verifier_log(.log))]
    Load {
        /// What the kernel said.
        #[source]
        source: io::Error,
        /// The verifier's log, if it wrote one.
        log: String,
    },
    /// Neither the driver's hook nor the generic one took the program.
    #[error("attaching the XDP program to interface {ifindex} refused (driver and generic mode)")]
    Attach {
        /// The interface.
        ifindex: u32,
        /// What the kernel said to the generic mode.
        #[source]
        source: io::Error,
    },
    /// The socket could not be put in the map.
    #[error("putting the AF_XDP socket in the XSKMAP refused")]
    Insert(#[source] io::Error),
}

fn verifier_log(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!(" (verifier: {})", log.trim())
    }
}

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before the kernel builds a socket buffer.
    Driver,
    /// In the kernel's generic hook, after it built one (any interface).
    Generic,
}

impl XdpMode {
    /// The mode in words.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Driver => "driver",
            XdpMode::Generic => "generic",
        }
    }
}

/// The program attached to an interface, with its map. Dropping it
/// detaches the program.
#[derive(Debug)]
pub struct XdpProgram {
    map: OwnedFd,
    /// Kept open: the program lives while the link holds it.
    _program: OwnedFd,
    /// Kept open: closing it detaches the program.
    _link: OwnedFd,
    mode: XdpMode,
}

impl XdpProgram {
    /// Loads the program for a port at `ip` and attaches it to interface
    /// `ifindex`, in the driver's hook where the driver has one, else in
    /// the generic hook.
    pub fn attach(ifindex: u32, ip: Ipv4Addr) -> Result<Self, ProgramError> {
        let map = create_map().map_err(ProgramError::Map)?;
        let program = load(&instructions(map.as_raw_fd(), ip))?;
        let (link, mode) = match link(&program, ifindex, XDP_FLAGS_DRV_MODE) {
            Ok(link) => (link, XdpMode::Driver),
            Err(_) => (
                link(&program, ifindex, XDP_FLAGS_SKB_MODE)
                    .map_err(|source| ProgramError::Attach { ifindex, source })?,
                XdpMode::Generic,
            ),
        };
        Ok(XdpProgram {
            map,
            _program: program,
            _link: link,
            mode,
        })
    }

    /// Where the program runs.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Sends frames of receive queue `queue` to socket `socket`.
    pub fn insert(&self, queue: u32, socket: RawFd) -> Result<(), ProgramError> {
        let value = socket as u32;
        let attr = MapElemAttr {
            map_fd: self.map.as_raw_fd() as u32,
            _pad: 0,
            key: (&raw const queue) as u64,
            value: (&raw const value) as u64,
            flags: 0,
        };
        // SAFETY: `attr` is a live BPF_MAP_UPDATE_ELEM attribute whose key
        // and value point at live u32s, as the map's sizes say.
        unsafe { bpf(BPF_MAP_UPDATE_ELEM, &attr) }
            .map(drop)
            .map_err(ProgramError::Insert)
    }
}

/// `union bpf_attr` for BPF_MAP_CREATE (the fields used).
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// `union bpf_attr` for BPF_MAP_UPDATE_ELEM.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for BPF_PROG_LOAD (the fields up to the attach type).
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE (the fields used).
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// The `bpf` system call with `attr`; a new descriptor or 0.
///
/// # Safety
/// `attr` must be the attribute `cmd` reads, and every pointer in it must
/// point at memory valid for what the command does with it.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<libc::c_long> {
    // SAFETY: the caller vouches for `attr`; its size is passed with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_ref(attr),
            size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A descriptor `bpf` returned.
fn owned(rc: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(rc as RawFd) }
}

fn create_map() -> io::Result<OwnedFd> {
    let attr = MapCreateAttr {
        map_type: MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: MAP_SLOTS,
        map_flags: 0,
    };
    // SAFETY: a BPF_MAP_CREATE attribute with no pointers.
    unsafe { bpf(BPF_MAP_CREATE, &attr) }.map(owned)
}

fn load(program: &[Insn]) -> Result<OwnedFd, ProgramError> {
    let license = CString::new(env!("CARGO_PKG_LICENSE")).unwrap_or_default();
    let mut log = vec![0u8; LOG_BYTES];
    let mut name = [0u8; 16];
    name[..10].copy_from_slice(b"pmem_roce\0");
    let mut attr = ProgLoadAttr {
        prog_type: PROG_TYPE_XDP,
        insn_cnt: program.len() as u32,
        insns: program.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: ATTACH_XDP,
    };
    // SAFETY: the attribute points at the live instructions (their count
    // passed) and the live NUL-terminated license.
    let first = unsafe { bpf(BPF_PROG_LOAD, &attr) };
    match first {
        Ok(fd) => Ok(owned(fd)),
        Err(source) => {
            // Again with the verifier's log, to say why.
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            // SAFETY: as above, and the log buffer is live and as long as
            // its size says.
            let _ = unsafe { bpf(BPF_PROG_LOAD, &attr) };
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(ProgramError::Load {
                source,
                log: String::from_utf8_lossy(&log[..end]).into_owned(),
            })
        }
    }
}

fn link(program: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let attr = LinkCreateAttr {
        prog_fd: program.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: ATTACH_XDP,
        flags,
    };
    // SAFETY: a BPF_LINK_CREATE attribute with no pointers.
    unsafe { bpf(BPF_LINK_CREATE, &attr) }.map(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_on_the_pass_on_block_and_the_program_ends_in_exits() {
        let program = instructions(7, Ipv4Addr::new(10, 0, 0, 200));
        assert_eq!(program.len(), 23);
        for (at, i) in program.iter().enumerate() {
            if i.code == JGT_X || i.code == JNE32_K {
                assert_eq!(at as i16 + 1 + i.off, 21, "jump at {at}");
            }
        }
        assert_eq!(program[20].code, EXIT);
        assert_eq!(program[22].code, EXIT);
        assert_eq!(program[16].imm, 7, "the map's descriptor");
        assert_eq!(program[16].regs, 1 | (PSEUDO_MAP_FD << 4));
    }

    #[test]
    fn the_compared_fields_are_the_frames_bytes_as_loaded() {
        let program = instructions(3, Ipv4Addr::new(10, 0, 0, 200));
        let frame_u16 = |b: [u8; 2]| i32::from(u16::from_ne_bytes(b));
        assert_eq!(program[6].imm, frame_u16([0x08, 0x00]), "EtherType IPv4");
        assert_eq!(program[12].imm, i32::from_ne_bytes([10, 0, 0, 200]));
        assert_eq!(program[14].imm, frame_u16([0x12, 0xb7]), "UDP 4791");
    }
}
