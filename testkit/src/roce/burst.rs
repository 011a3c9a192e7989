//! Datagrams moved in bursts on [`super::RawRoceClient`]'s raw sockets.
//!
//! An RNIC sends the packets of the work requests posted under one doorbell
//! back to back; this client does the same by handing every packet its
//! queue pair has ready to the kernel in one `sendmmsg` ([`Outbox`]). It
//! reads with one `recvmmsg` that waits for the first datagram and takes
//! whatever else has arrived ([`Inbox`]). Without the bursts each packet
//! took a system call of its own, and the device saw a batch of requests
//! trickle in one frame at a time where a TCP client writes it at once.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use socket2::Socket;

/// Datagrams per system call.
pub const BURST: usize = 32;
/// Bytes kept of each datagram read: a RoCEv2 packet of the largest path
/// MTU (4 KiB) with its headers fits.
const DATAGRAM_CAP: usize = 4096 + 256;

/// Datagrams waiting to be sent together.
#[derive(Debug, Default)]
pub struct Outbox {
    frames: Vec<Vec<u8>>,
    count: usize,
}

impl Outbox {
    /// The buffer for the next datagram; [`Outbox::commit`] keeps what is
    /// written into it.
    pub fn slot(&mut self) -> &mut Vec<u8> {
        if self.frames.len() == self.count {
            self.frames.push(Vec::new());
        }
        &mut self.frames[self.count]
    }

    /// Keeps the datagram written into the last [`Outbox::slot`].
    pub fn commit(&mut self) {
        self.count += 1;
    }

    /// Whether a burst's worth waits.
    pub fn is_full(&self) -> bool {
        self.count >= BURST
    }

    /// Sends every datagram waiting to `to`, [`BURST`] per system call,
    /// blocking until the kernel took them all.
    pub fn send(&mut self, socket: &Socket, to: Ipv4Addr) -> io::Result<()> {
        let dest = sockaddr_in(to);
        let mut sent = 0;
        while sent < self.count {
            let pending = &mut self.frames[sent..self.count.min(sent + BURST)];
            let mut iov: [libc::iovec; BURST] = std::array::from_fn(|_| libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            });
            // SAFETY: mmsghdr is plain old data; all zeroes is valid.
            let mut msgs: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
            for (i, frame) in pending.iter_mut().enumerate() {
                iov[i] = libc::iovec {
                    iov_base: frame.as_mut_ptr().cast(),
                    iov_len: frame.len(),
                };
                msgs[i].msg_hdr.msg_iov = &raw mut iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
                msgs[i].msg_hdr.msg_name = (&raw const dest).cast_mut().cast();
                msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            // SAFETY: the first `pending.len()` headers point at live iovecs
            // over the pending frames and at `dest`, all of which outlive
            // the call; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    pending.len() as libc::c_uint,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.count = 0;
                return Err(e);
            }
            sent += n as usize;
        }
        self.count = 0;
        Ok(())
    }
}

/// Datagrams read by one `recvmmsg`.
#[derive(Debug)]
pub struct Inbox {
    buf: Vec<u8>,
    lens: [usize; BURST],
    count: usize,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            buf: vec![0; DATAGRAM_CAP * BURST],
            lens: [0; BURST],
            count: 0,
        }
    }
}

impl Inbox {
    /// Waits for a datagram as long as the socket's read timeout allows,
    /// then takes every other one already there (up to [`BURST`]); returns
    /// how many, 0 when the wait timed out.
    pub fn receive(&mut self, socket: &Socket) -> io::Result<usize> {
        self.count = 0;
        let mut iov: [libc::iovec; BURST] = std::array::from_fn(|i| libc::iovec {
            iov_base: self.buf[i * DATAGRAM_CAP..].as_mut_ptr().cast(),
            iov_len: DATAGRAM_CAP,
        });
        // SAFETY: mmsghdr is plain old data; all zeroes is valid.
        let mut msgs: [libc::mmsghdr; BURST] = unsafe { std::mem::zeroed() };
        for (msg, iov) in msgs.iter_mut().zip(iov.iter_mut()) {
            msg.msg_hdr.msg_iov = iov;
            msg.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at a live iovec over its own
        // DATAGRAM_CAP bytes of `self.buf`, which outlive the call; BURST
        // headers are passed.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                BURST as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for (len, msg) in self.lens.iter_mut().zip(&msgs[..n]) {
            // A datagram cut short is not a RoCEv2 packet of this queue pair.
            *len = if msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                0
            } else {
                msg.msg_len as usize
            };
        }
        self.count = n;
        Ok(n)
    }

    /// The datagrams the last [`Inbox::receive`] read.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        self.lens[..self.count]
            .iter()
            .enumerate()
            .map(|(i, len)| &self.buf[i * DATAGRAM_CAP..i * DATAGRAM_CAP + len])
    }
}

fn sockaddr_in(ip: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}
