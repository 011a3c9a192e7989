//! A non-blocking connection with a frame decoder on the way in and a
//! bounded send queue on the way out.
//!
//! Small frames are queued and written together at the end of an event-loop
//! turn (many replies per system call). A large frame goes out with one
//! vectored write straight from its head and the payload slice it was
//! relayed from, so the payload is not copied; only what the socket does not
//! take at once is queued.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::rc::Rc;

use mio::net::TcpStream;
use proto::FrameDecoder;
use proto::decoder::{ReadError, ReadOutcome};

use super::backend::uring::{self, Receive};

/// Frames at least this long are written directly instead of queued.
const DIRECT_WRITE_MIN: usize = 16 * 1024;
/// Most bytes read per read call.
const READ_MAX: usize = 256 * 1024;
/// On io_uring, a frame with this many bytes still to come is received
/// straight into the decoder (see [`uring::Socket::leave_shared`]).
const OWN_RECEIVE_MIN: usize = 64 * 1024;

/// Frames at least this long are admitted against a budget before their
/// body is read (see [`Endpoint::fill`]).
pub const ADMIT_MIN: usize = 64 * 1024;

/// What reading from an endpoint ended with.
#[derive(Debug)]
pub enum Fill {
    /// The socket has nothing more for now.
    Drained,
    /// The frame being received was not admitted: read again later.
    NotAdmitted,
    /// The decoder is full: hand frames out before reading more.
    Full,
    /// The peer closed the connection.
    Closed,
    /// The stream cannot be framed any more, or the socket failed.
    Failed(String),
}

/// One connection's socket, decoder and send queue.
#[derive(Debug)]
pub struct Endpoint {
    /// The socket.
    pub stream: TcpStream,
    /// Frames coming in.
    pub decoder: FrameDecoder,
    out: Vec<u8>,
    out_pos: usize,
    /// An event said the peer hung up or the socket failed: read on to the
    /// end or the error instead of stopping after a short read, since no
    /// further event will come.
    hangup_seen: bool,
    /// Bytes `admit` last approved (see [`Endpoint::fill`]).
    admitted: usize,
    /// On io_uring: what the ring received and the send in flight. Then
    /// reads come from here and writes go through the ring; else they are
    /// system calls on a socket mio watches.
    ring: Option<uring::Socket>,
}

impl Endpoint {
    /// An endpoint over a connected (or connecting) socket.
    pub fn new(stream: TcpStream) -> Self {
        Self::with_decoder(stream, FrameDecoder::new())
    }

    /// An endpoint whose frames come through `decoder` (e.g. one that
    /// takes small frames only until the peer is known).
    pub fn with_decoder(stream: TcpStream, decoder: FrameDecoder) -> Self {
        Self {
            stream,
            decoder,
            out: Vec::new(),
            out_pos: 0,
            hangup_seen: false,
            admitted: 0,
            ring: None,
        }
    }

    /// Moves the socket onto the io_uring whose sockets share `shared`
    /// and starts receiving as `receive` says (the socket must not be
    /// registered with mio).
    pub fn attach(&mut self, shared: &Rc<uring::Shared>, receive: Receive) {
        let mut socket = uring::Socket::new(shared, self.stream.as_raw_fd(), receive);
        socket.arm();
        self.ring = Some(socket);
        // A socket receiving into the decoder starts here (a failure is
        // read by the first `fill`).
        let _ = self.receive_into_decoder();
    }

    /// Whether the socket is on io_uring and receives straight into the
    /// decoder's buffer now.
    fn receives_into_decoder(&self) -> bool {
        self.ring
            .as_ref()
            .is_some_and(|socket| socket.receive() == Receive::Own)
    }

    /// Bytes of the frame being received still to come (0 between frames
    /// and while its header is incomplete).
    fn missing(&self) -> usize {
        let decoder = &self.decoder;
        decoder
            .frame_in_progress()
            .map_or(0, |len| len - decoder.partial())
    }

    /// On io_uring, once what the ring received is all read: keeps one
    /// receive running, into the ring's buffers, or for the rest of a
    /// large frame (and always on a server link) into the decoder's.
    fn keep_receiving(&mut self) -> Fill {
        let large = self.missing() >= OWN_RECEIVE_MIN;
        let Some(socket) = &mut self.ring else {
            return Fill::Drained;
        };
        match socket.receive() {
            Receive::Shared if large => socket.leave_shared(),
            Receive::Own if !large => socket.return_home(),
            _ => {}
        }
        socket.arm();
        self.receive_into_decoder().unwrap_or(Fill::Drained)
    }

    /// On a socket receiving into the decoder: starts a receive into the
    /// decoder's free room unless one runs or the stream is over. A
    /// server link receives the rest of a large frame whole (one
    /// completion); a client's socket receives no further than the frame's
    /// end, and completes with what arrived, so the client's traffic is
    /// seen as it comes (its idle timeout counts from it). Returns what
    /// stops reading: the decoder is full, or failed.
    fn receive_into_decoder(&mut self) -> Option<Fill> {
        let missing = self.missing();
        let socket = self.ring.as_mut()?;
        if socket.receive() != Receive::Own || socket.receiving() || socket.finished() {
            return None;
        }
        let frame_only = socket.home() == Receive::Shared;
        match self.decoder.read_area(missing.max(READ_MAX)) {
            Ok(Some(area)) => {
                let whole = !frame_only && missing >= OWN_RECEIVE_MIN && area.len() >= missing;
                let area = if whole || frame_only {
                    let len = area.len().min(missing.max(1));
                    &mut area[..len]
                } else {
                    area
                };
                // SAFETY: the area stays where it is until the receive's
                // completion reaches `received`: this endpoint takes bytes
                // into its decoder only there (`fill` reads nothing itself
                // on such a socket, `trim_idle` keeps the decoder), and if
                // it is dropped first the buffer goes to `bury`.
                unsafe { socket.receive_into(area, whole) };
                None
            }
            Ok(None) => Some(Fill::Full),
            Err(e) => Some(Fill::Failed(e.to_string())),
        }
    }

    /// The ring's slot of this socket, when it is on io_uring.
    pub fn ring_slot(&self) -> Option<u64> {
        self.ring.as_ref().map(uring::Socket::slot)
    }

    /// Takes a receive completion of the ring (bytes are read out by
    /// [`fill`](Self::fill), where they are until [`settle`](Self::settle)).
    ///
    /// # Safety
    /// As [`uring::Socket::received`]: `bytes` stay valid and unchanged
    /// until `settle` is called or the endpoint is dropped.
    pub unsafe fn received(&mut self, result: i32, bytes: &[u8], more: bool) {
        let Some(socket) = &mut self.ring else {
            return;
        };
        if socket.receive() == Receive::Shared {
            // SAFETY: passed on to our caller.
            unsafe { socket.received(result, bytes, more) };
            return;
        }
        let read = socket.received_own(result);
        if read == 0 {
            return;
        }
        match self.decoder.commit_read(read) {
            // The decoder keeps a framing error and reports it.
            Ok(()) | Err(ReadError::Framing(_)) => {}
            Err(ReadError::Io(e)) => socket.fail(&e),
        }
    }

    /// Ends the loan of the ring's buffer: what was not read is staged.
    pub fn settle(&mut self) {
        if let Some(socket) = &mut self.ring {
            socket.settle();
        }
    }

    /// Whether the ring is receiving for this socket (false on epoll, and
    /// while a paused reader stopped it).
    pub fn ring_receiving(&self) -> bool {
        self.ring.as_ref().is_some_and(uring::Socket::receiving)
    }

    /// Takes a send completion of the ring; an error means the connection
    /// failed.
    pub fn sent(&mut self, result: i32) -> io::Result<()> {
        match &mut self.ring {
            Some(socket) => socket.sent(result, &mut self.out),
            None => Ok(()),
        }
    }

    /// Frees the buffers of a connection with nothing held, queued or in
    /// flight, so an idle connection costs little memory; a no-op
    /// otherwise. The decoder keeps its limit.
    pub fn trim_idle(&mut self) {
        if self.decoder.buffered() == 0
            && self.decoder.error().is_none()
            && !self.receives_into_decoder()
        {
            self.decoder = FrameDecoder::with_max_body_len(self.decoder.max_body_len());
            self.admitted = 0;
        }
        if self.pending_out() == 0 {
            self.out = Vec::new();
            self.out_pos = 0;
        }
        if let Some(socket) = &mut self.ring {
            socket.trim();
        }
    }

    /// Bytes the decoder will hold once the frame being received is in:
    /// the whole frames it holds, plus that frame's full length (or the
    /// bytes of it there are, while its header is incomplete).
    pub fn held_when_complete(&self) -> usize {
        let decoder = &self.decoder;
        let whole = decoder.buffered() - decoder.partial();
        whole + decoder.frame_in_progress().unwrap_or(decoder.partial())
    }

    /// What the connection is to be charged now: what it will hold once
    /// the frame being received is in, as far as `admit` approved it, and
    /// at least the bytes it holds.
    pub fn settle_charge(&mut self) -> usize {
        let held = self.decoder.buffered();
        let charge = self.held_when_complete().min(held.max(self.admitted));
        self.admitted = charge;
        charge
    }

    /// Bytes queued and not yet written.
    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos + self.ring.as_ref().map_or(0, uring::Socket::sending)
    }

    /// Notes what a readiness event said about the peer: once it hung up
    /// (or the socket failed), [`fill`](Self::fill) reads until the end.
    pub fn note_event(&mut self, event: &mio::event::Event) {
        if event.is_read_closed() || event.is_error() {
            self.hangup_seen = true;
        }
    }

    /// Reads whatever the socket has, as far as the decoder has room.
    ///
    /// A read that returns fewer bytes than it asked for has emptied the
    /// socket's receive queue (TCP copies until the queue is empty or the
    /// buffer full). When it also ended on a frame boundary (the peer
    /// finished a batch), the socket counts as drained without another
    /// read that would only say `WouldBlock`: bytes arriving later raise a
    /// new readiness event (mio registers edge-triggered). In the middle of
    /// a frame (a large payload streaming in) it reads on, since more is
    /// about to arrive. A hang-up already reported raises no new event, so
    /// after [`note_event`](Self::note_event) saw one, reading goes on to
    /// the end of the stream.
    ///
    /// Before reading the body of a frame of [`ADMIT_MIN`] bytes or more,
    /// `admit` is asked with [`held_when_complete`](Self::held_when_complete)
    /// (unless it approved as much already); when it says no, nothing more
    /// is read ([`Fill::NotAdmitted`]).
    pub fn fill(&mut self, admit: &mut dyn FnMut(usize) -> bool) -> Fill {
        loop {
            let want = self.held_when_complete();
            if self.decoder.frame_in_progress().unwrap_or(0) >= ADMIT_MIN && want > self.admitted {
                if !admit(want) {
                    return Fill::NotAdmitted;
                }
                self.admitted = want;
            }
            if let Some(socket) = &mut self.ring {
                // On io_uring: what the ring received into its buffers;
                // once that is taken the socket counts as drained, and a
                // receive runs again (also if a paused reader had stopped
                // it). A receive into the decoder brings its bytes there
                // by itself, and the decoder's buffer stays as it is
                // meanwhile.
                if socket.receive() == Receive::Own && socket.receiving() {
                    return Fill::Drained;
                }
                match self.decoder.read_from(socket, READ_MAX) {
                    Ok(ReadOutcome::Data(_)) => continue,
                    Ok(ReadOutcome::Full) => return Fill::Full,
                    Ok(ReadOutcome::Eof) => return Fill::Closed,
                    Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                        return self.keep_receiving();
                    }
                    Err(ReadError::Io(e)) => return Fill::Failed(e.to_string()),
                    Err(ReadError::Framing(e)) => return Fill::Failed(e.to_string()),
                }
            }
            let mut probe = ShortReadProbe {
                stream: &mut self.stream,
                short: false,
            };
            match self.decoder.read_from(&mut probe, READ_MAX) {
                Ok(ReadOutcome::Data(_))
                    if probe.short && !self.hangup_seen && self.decoder.partial() == 0 =>
                {
                    self.decoder.reader_drained();
                    return Fill::Drained;
                }
                Ok(ReadOutcome::Data(_)) => continue,
                Ok(ReadOutcome::Full) => return Fill::Full,
                Ok(ReadOutcome::Eof) => return Fill::Closed,
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Fill::Drained;
                }
                Err(ReadError::Io(e)) => return Fill::Failed(e.to_string()),
                Err(ReadError::Framing(e)) => return Fill::Failed(e.to_string()),
            }
        }
    }

    /// Sends one frame made of `head` and `payload`.
    ///
    /// A large frame with nothing queued before it is written at once
    /// from where it lies (one vectored write, also on io_uring, whose
    /// sends go from the queue); what the socket does not take is queued.
    pub fn send(&mut self, head: &[u8], payload: &[u8]) -> io::Result<()> {
        if head.len() + payload.len() < DIRECT_WRITE_MIN {
            self.out.extend_from_slice(head);
            self.out.extend_from_slice(payload);
            return Ok(());
        }
        // On io_uring, a write of our own may go out only while no send is
        // queued or in flight: the stream's bytes keep their order.
        if self.ring.is_none() {
            self.flush()?;
        }
        if self.pending_out() > 0 {
            self.out.extend_from_slice(head);
            self.out.extend_from_slice(payload);
            return Ok(());
        }
        let written = write_parts(&mut self.stream, head, payload)?;
        if written < head.len() {
            self.out.extend_from_slice(&head[written..]);
            self.out.extend_from_slice(payload);
        } else {
            self.out.extend_from_slice(&payload[written - head.len()..]);
        }
        Ok(())
    }

    /// Writes queued bytes until the socket would block; on io_uring,
    /// hands them to a send unless one is in flight (its completion sends
    /// what gathered meanwhile).
    pub fn flush(&mut self) -> io::Result<()> {
        if let Some(socket) = &mut self.ring {
            socket.send(&mut self.out);
            return Ok(());
        }
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            if self.out.capacity() > 4 * DIRECT_WRITE_MIN * 16 {
                self.out.shrink_to(DIRECT_WRITE_MIN * 16);
            }
        }
        Ok(())
    }
}

impl Drop for Endpoint {
    /// A receive in flight may still write into the decoder's buffer: the
    /// ring keeps the buffer until that receive has ended.
    fn drop(&mut self) {
        if let Some(socket) = &mut self.ring
            && socket.receive() == Receive::Own
            && socket.receiving()
        {
            socket.bury(std::mem::take(&mut self.decoder).into_buffer());
        }
    }
}

/// A socket reader that notes whether a read returned less than it was
/// asked for.
struct ShortReadProbe<'a> {
    stream: &'a mut TcpStream,
    short: bool,
}

impl Read for ShortReadProbe<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        self.short = n > 0 && n < buf.len();
        Ok(n)
    }
}

/// Writes as much of `head` then `payload` as the socket takes now, with
/// vectored writes; returns how many bytes went out.
fn write_parts(stream: &mut TcpStream, head: &[u8], payload: &[u8]) -> io::Result<usize> {
    let total = head.len() + payload.len();
    let mut written = 0;
    while written < total {
        let result = if written < head.len() {
            stream.write_vectored(&[IoSlice::new(&head[written..]), IoSlice::new(payload)])
        } else {
            stream.write(&payload[written - head.len()..])
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}
