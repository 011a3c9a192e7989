//! One io_uring for the device's TCP sockets.
//!
//! - Listeners take one multishot accept each; every accepted socket comes
//!   back as a completion.
//! - A client's socket has one multishot receive into the ring's provided
//!   buffers ([`BUFFERS`] of [`BUFFER_LEN`] bytes shared by all sockets):
//!   a buffer is taken only when bytes arrive and is lent to the socket's
//!   reader for the turn that received it; what the reader did not take is
//!   copied into the socket's staging area before the buffer goes back, so
//!   an idle (or paused) connection holds no receive buffer.
//! - A server link's socket has one receive at a time straight into its
//!   reader's buffer ([`Receive::Own`]): bulk replies are copied once, by
//!   the kernel, as a read on epoll copies them, instead of into a provided
//!   buffer and then again into the reader's.
//! - Sends are queued as entries while a turn runs and submitted together
//!   with the next wait: one `io_uring_enter` per turn for every socket,
//!   none at all when a spinning device has nothing to submit (or, with
//!   SQPOLL, a kernel thread takes them).
//! - The epoll instance that still watches signals, the map watcher's waker,
//!   RoCEv2 packet sockets and connects in progress is itself watched by a
//!   multishot poll, so one wait covers everything.
//!
//! Sockets queue their entries in a [`Shared`] outbox; [`Ring::wait`] moves
//! them into the submission queue. Each entry's user data names the socket
//! by a slot number never reused, and the operation, so a completion for a
//! socket closed since is recognised and only its buffer taken back.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

/// The provided-buffer group every receive takes from.
const BUFFER_GROUP: u16 = 0;
/// Receive buffers in the group (a power of two).
pub const BUFFERS: u16 = 512;
/// Bytes in one receive buffer.
pub const BUFFER_LEN: usize = 16 * 1024;
/// Submission queue entries.
const SQ_ENTRIES: u32 = 1024;
/// Completion queue entries: room for a receive per buffer and a send per
/// socket of a busy turn.
const CQ_ENTRIES: u32 = 16 * 1024;
/// A socket with this many bytes received and not yet framed (its reader
/// is paused) stops receiving until they are taken.
pub const STAGED_HIGH: usize = 256 * 1024;
/// How long the SQPOLL thread spins without work before it sleeps.
const SQPOLL_IDLE_MS: u32 = 1000;

/// What an entry asked the kernel to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A listener's multishot accept (the slot is the port index).
    Accept = 1,
    /// A socket's multishot receive.
    Recv = 2,
    /// A socket's send.
    Send = 3,
    /// The multishot poll of the epoll instance.
    Watch = 4,
    /// A cancellation (its completion says nothing the loop needs).
    Cancel = 5,
    /// A socket whose receive was stopped: its peer hung up (or it failed).
    Hangup = 6,
}

/// The user data of an entry for `slot` and `op`.
pub fn user_data(slot: u64, op: Op) -> u64 {
    (slot << 3) | op as u64
}

/// One completion, copied out of the completion queue.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    user_data: u64,
    /// The operation's result: bytes or a file descriptor, or `-errno`.
    pub result: i32,
    flags: u32,
}

impl Completion {
    /// The socket (or, for [`Op::Accept`], the port index) it is for.
    pub fn slot(&self) -> u64 {
        self.user_data >> 3
    }

    /// What was asked; `None` for user data this ring never wrote.
    pub fn op(&self) -> Option<Op> {
        match self.user_data & 7 {
            1 => Some(Op::Accept),
            2 => Some(Op::Recv),
            3 => Some(Op::Send),
            4 => Some(Op::Watch),
            5 => Some(Op::Cancel),
            6 => Some(Op::Hangup),
            _ => None,
        }
    }

    /// Whether a multishot operation goes on (else it must be armed again).
    pub fn more(&self) -> bool {
        cqueue::more(self.flags)
    }

    /// The provided buffer the bytes are in, for a receive.
    pub fn buffer(&self) -> Option<u16> {
        cqueue::buffer_select(self.flags)
    }
}

/// What sockets share with the ring: the entries they queued, the
/// buffers of sockets closed while a send or receive into them was in
/// flight, slot numbers.
#[derive(Debug, Default)]
pub struct Shared {
    outbox: RefCell<Vec<squeue::Entry>>,
    /// Kept, under their entry's user data, until the operation completes:
    /// the kernel may still read (a send) or write (a receive) them.
    graveyard: RefCell<HashMap<u64, Vec<u8>>>,
    next_slot: Cell<u64>,
}

impl Shared {
    fn push(&self, entry: squeue::Entry) {
        self.outbox.borrow_mut().push(entry);
    }
}

/// The provided-buffer ring: its entries (shared with the kernel) and the
/// buffers they point at.
struct BufRing {
    entries: *mut types::BufRingEntry,
    entries_layout: std::alloc::Layout,
    buffers: *mut u8,
    buffers_layout: std::alloc::Layout,
    tail: u16,
}

impl std::fmt::Debug for BufRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufRing").field("tail", &self.tail).finish()
    }
}

impl BufRing {
    fn new() -> io::Result<Self> {
        let entries_layout = std::alloc::Layout::from_size_align(
            usize::from(BUFFERS) * std::mem::size_of::<types::BufRingEntry>(),
            4096,
        )
        .map_err(io::Error::other)?;
        let buffers_layout =
            std::alloc::Layout::from_size_align(usize::from(BUFFERS) * BUFFER_LEN, 4096)
                .map_err(io::Error::other)?;
        // SAFETY: both layouts have a non-zero size.
        let entries = unsafe { std::alloc::alloc_zeroed(entries_layout) };
        // SAFETY: as above. Pages are touched only once the kernel writes
        // into a buffer.
        let buffers = unsafe { std::alloc::alloc_zeroed(buffers_layout) };
        if entries.is_null() || buffers.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        Ok(Self {
            entries: entries.cast(),
            entries_layout,
            buffers,
            buffers_layout,
            tail: 0,
        })
    }

    /// Hands buffer `bid` (back) to the kernel.
    fn provide(&mut self, bid: u16) {
        let index = usize::from(self.tail & (BUFFERS - 1));
        // SAFETY: `index` < BUFFERS, within the allocation; the kernel
        // reads an entry only once the tail published below covers it, and
        // the entry at the tail is not one it still owns.
        let entry = unsafe { &mut *self.entries.add(index) };
        // SAFETY: `bid` < BUFFERS (it came from the kernel, which got it
        // from this ring), so the offset is within the buffers.
        entry.set_addr(unsafe { self.buffers.add(usize::from(bid) * BUFFER_LEN) } as u64);
        entry.set_len(BUFFER_LEN as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail is a u16 inside the first entry, which lives
        // as long as `self`, and is only ever accessed atomically by us and
        // the kernel.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.entries).cast::<AtomicU16>()) };
        tail.store(self.tail, Ordering::Release);
    }

    /// The `len` bytes the kernel wrote into buffer `bid`.
    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let bid = usize::from(bid) % usize::from(BUFFERS);
        // SAFETY: the range is within the buffers; the kernel finished
        // writing it before posting the completion, and does not write it
        // again until `provide` hands it back.
        unsafe {
            std::slice::from_raw_parts(self.buffers.add(bid * BUFFER_LEN), len.min(BUFFER_LEN))
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these layouts; the ring that used
        // them is dropped first (field order of `Ring`).
        unsafe {
            std::alloc::dealloc(self.entries.cast(), self.entries_layout);
            std::alloc::dealloc(self.buffers, self.buffers_layout);
        }
    }
}

/// The device's io_uring.
pub struct Ring {
    ring: IoUring,
    bufs: BufRing,
    shared: Rc<Shared>,
    sqpoll: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("sqpoll", &self.sqpoll)
            .field("bufs", &self.bufs)
            .finish()
    }
}

impl Ring {
    /// Sets the ring up with its provided buffers. `sqpoll`: a kernel
    /// thread polls the submission queue.
    ///
    /// Otherwise the kernel finishes a receive (copies the bytes into a
    /// provided buffer and posts the completion) as work for the device's
    /// thread, which it runs at the thread's next system call and flags
    /// in the ring (`COOP_TASKRUN`, `TASKRUN_FLAG`): a spinning loop sees
    /// the flag and enters the kernel once for every arrival since, and
    /// no interrupt stops it per arrival.
    pub fn new(sqpoll: bool) -> io::Result<Self> {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(CQ_ENTRIES);
        if sqpoll {
            builder.setup_sqpoll(SQPOLL_IDLE_MS);
        } else {
            builder.setup_coop_taskrun().setup_taskrun_flag();
        }
        let ring = match builder.build(SQ_ENTRIES) {
            Ok(ring) => ring,
            // An older kernel without the optional flags.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !sqpoll => IoUring::builder()
                .setup_cqsize(CQ_ENTRIES)
                .build(SQ_ENTRIES)?,
            Err(e) => return Err(e),
        };
        let mut bufs = BufRing::new()?;
        // SAFETY: the entries stay allocated until `bufs` drops, after
        // the ring (which unregisters them as it closes).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.entries as u64,
                BUFFERS,
                BUFFER_GROUP,
                0,
            )?;
        }
        for bid in 0..BUFFERS {
            bufs.provide(bid);
        }
        Ok(Self {
            ring,
            bufs,
            shared: Rc::new(Shared::default()),
            sqpoll,
        })
    }

    /// What sockets queue their entries in.
    pub fn shared(&self) -> &Rc<Shared> {
        &self.shared
    }

    /// Queues a multishot accept on listener `fd` of port `port`.
    pub fn accept(&self, port: usize, fd: RawFd) {
        let entry = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(port as u64, Op::Accept));
        self.shared.push(entry);
    }

    /// Stops port `port`'s accepts.
    pub fn stop_accepting(&self, port: usize) {
        let entry = opcode::AsyncCancel::new(user_data(port as u64, Op::Accept))
            .build()
            .user_data(user_data(0, Op::Cancel));
        self.shared.push(entry);
    }

    /// Queues a multishot poll for input on `fd` (the epoll instance).
    pub fn watch(&self, fd: RawFd) {
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(0, Op::Watch));
        self.shared.push(entry);
    }

    /// Submits what was queued and, unless `timeout` is zero or
    /// completions are already waiting, waits up to `timeout` for one.
    ///
    /// A spinning loop (`timeout` zero) with nothing to submit makes no
    /// system call: completions appear in the shared queue by themselves.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let pushed = self.drain_outbox()?;
        let ready = !self.ring.completion().is_empty();
        let taskrun = self.ring.submission().taskrun();
        let result = if timeout.is_zero() || ready {
            if pushed > 0 || taskrun {
                self.ring.submitter().submit()
            } else {
                Ok(0)
            }
        } else {
            let ts = types::Timespec::from(timeout);
            let args = types::SubmitArgs::new().timespec(&ts);
            self.ring.submitter().submit_with_args(1, &args)
        };
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Moves the queued entries into the submission queue, submitting
    /// whenever it is full; how many were moved.
    fn drain_outbox(&mut self) -> io::Result<usize> {
        let entries = std::mem::take(&mut *self.shared.outbox.borrow_mut());
        let mut moved = 0;
        for entry in &entries {
            loop {
                // SAFETY: every entry points at memory that outlives its
                // completion: the buffer ring, a socket's send buffer
                // (kept in the graveyard if the socket closes first), or
                // nothing.
                let pushed = unsafe { self.ring.submission().push(entry) };
                if pushed.is_ok() {
                    moved += 1;
                    break;
                }
                match self.ring.submitter().submit() {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        // The completion queue is full: the caller reaps,
                        // and the rest goes next turn.
                        let mut outbox = self.shared.outbox.borrow_mut();
                        let rest = entries.len() - moved;
                        outbox.splice(0..0, entries.into_iter().skip(moved).take(rest));
                        return Ok(moved);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(moved)
    }

    /// Copies the waiting completions into `out`.
    pub fn reap(&mut self, out: &mut Vec<Completion>) {
        out.extend(self.ring.completion().map(|c| Completion {
            user_data: c.user_data(),
            result: c.result(),
            flags: c.flags(),
        }));
    }

    /// The bytes a receive completion carries (empty when it has none).
    pub fn received(&self, completion: &Completion) -> &[u8] {
        match completion.buffer() {
            Some(bid) if completion.result > 0 => self.bufs.bytes(bid, completion.result as usize),
            _ => &[],
        }
    }

    /// Hands a receive completion's buffer back to the kernel; and drops
    /// the buffer of a socket closed while it was sending or receiving
    /// into its own buffer, once that operation has ended.
    pub fn release(&mut self, completion: &Completion) {
        if let Some(bid) = completion.buffer() {
            self.bufs.provide(bid);
            return;
        }
        let ended = match completion.op() {
            Some(Op::Send) => true,
            Some(Op::Recv) => !completion.more(),
            _ => false,
        };
        // Most completions (every receive of a server link) find the
        // graveyard empty: no key to hash then.
        let mut graveyard = self.shared.graveyard.borrow_mut();
        if ended && !graveyard.is_empty() {
            graveyard.remove(&completion.user_data);
        }
    }
}

/// Bytes of a provided buffer lent to a socket's reader: `pos..len` of
/// them are unread.
#[derive(Debug)]
struct Lent {
    ptr: *const u8,
    len: usize,
    pos: usize,
}

impl Lent {
    fn remaining(&self) -> usize {
        self.len - self.pos
    }
}

/// Where a socket's receives put the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// A multishot receive into the ring's provided buffers, lent to the
    /// reader: an idle socket holds no receive buffer (client connections,
    /// which are many and mostly idle).
    Shared,
    /// One receive at a time into an area of the reader's own buffer
    /// ([`Socket::receive_into`]): the kernel's copy is the only one
    /// (server links, which are few and carry bulk replies; and a client's
    /// socket for the rest of a large frame, see [`Socket::leave_shared`]).
    Own,
}

/// A connected socket's side of the ring: bytes received and not yet
/// framed, and the send in flight.
#[derive(Debug)]
pub struct Socket {
    shared: Rc<Shared>,
    slot: u64,
    fd: RawFd,
    /// How it receives now.
    receive: Receive,
    /// How it receives between large frames.
    home: Receive,
    /// Its multishot receive is being cancelled, to receive into the
    /// reader's own buffer once that has ended.
    leaving: bool,
    staged: Vec<u8>,
    staged_pos: usize,
    /// The provided buffer whose bytes the reader reads first, lent until
    /// [`Socket::settle`]; only while nothing is staged.
    lent: Option<Lent>,
    eof: bool,
    failed: Option<io::ErrorKind>,
    failure: String,
    recv_armed: bool,
    cancelling: bool,
    sending: Vec<u8>,
    send_pos: usize,
    send_busy: bool,
}

impl Socket {
    /// The ring side of socket `fd` (which must outlive it); receiving
    /// starts with [`Socket::arm`] or [`Socket::receive_into`], as
    /// `receive` says.
    pub fn new(shared: &Rc<Shared>, fd: RawFd, receive: Receive) -> Self {
        let slot = shared.next_slot.get() + 1;
        shared.next_slot.set(slot);
        Self {
            shared: Rc::clone(shared),
            slot,
            fd,
            receive,
            home: receive,
            leaving: false,
            staged: Vec::new(),
            staged_pos: 0,
            lent: None,
            eof: false,
            failed: None,
            failure: String::new(),
            recv_armed: false,
            cancelling: false,
            sending: Vec::new(),
            send_pos: 0,
            send_busy: false,
        }
    }

    /// Whether a receive runs (else the peer's hang-up is only seen by
    /// the [`Op::Hangup`] poll).
    pub fn receiving(&self) -> bool {
        self.recv_armed
    }

    /// The number in its entries' user data.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// Bytes received and not yet read out.
    pub fn staged(&self) -> usize {
        self.staged.len() - self.staged_pos + self.lent.as_ref().map_or(0, Lent::remaining)
    }

    /// Bytes handed to a send that has not completed.
    pub fn sending(&self) -> usize {
        if self.send_busy {
            self.sending.len() - self.send_pos
        } else {
            0
        }
    }

    /// Where this socket's receives put the bytes now.
    pub fn receive(&self) -> Receive {
        self.receive
    }

    /// Where they go between large frames.
    pub fn home(&self) -> Receive {
        self.home
    }

    /// Moves a socket that receives into the ring's buffers to receiving
    /// into its reader's own, for the rest of a large frame: its multishot
    /// receive is cancelled, and the socket is [`Receive::Own`] once that
    /// has ended (at once when none runs). Only one receive ever runs, so
    /// the bytes keep their order.
    pub fn leave_shared(&mut self) {
        if self.receive != Receive::Shared || self.leaving {
            return;
        }
        if !self.recv_armed {
            self.receive = Receive::Own;
            return;
        }
        self.leaving = true;
        if !self.cancelling {
            let entry = opcode::AsyncCancel::new(user_data(self.slot, Op::Recv))
                .build()
                .user_data(user_data(self.slot, Op::Cancel));
            self.shared.push(entry);
            self.cancelling = true;
        }
    }

    /// Back to the ring's buffers (a multishot receive starts) for a
    /// socket that left them, once its own receive has ended.
    pub fn return_home(&mut self) {
        if self.receive == Receive::Own && self.home == Receive::Shared && !self.recv_armed {
            self.receive = Receive::Shared;
            self.arm();
        }
    }

    /// Starts a multishot receive unless one runs, the stream ended,
    /// enough is staged already, or the socket receives into its reader's
    /// own buffer.
    pub fn arm(&mut self) {
        if self.receive == Receive::Own
            || self.leaving
            || self.recv_armed
            || self.eof
            || self.failed.is_some()
            || self.staged() >= STAGED_HIGH
        {
            return;
        }
        let entry = opcode::RecvMulti::new(types::Fd(self.fd), BUFFER_GROUP)
            .build()
            .user_data(user_data(self.slot, Op::Recv));
        self.shared.push(entry);
        self.recv_armed = true;
        self.cancelling = false;
    }

    /// Starts a receive into `area` (a [`Receive::Own`] socket), unless one
    /// runs or the stream ended or failed; whether it started. With
    /// `whole`, it completes only once `area` is full (or the stream ends
    /// or fails): for the rest of a frame known to be that long.
    ///
    /// # Safety
    /// `area` must stay allocated, unmoved and otherwise untouched until
    /// the receive's completion has been handed to
    /// [`Socket::received_own`], or, if the socket goes first, until its
    /// buffer was handed to [`Socket::bury`].
    pub unsafe fn receive_into(&mut self, area: &mut [u8], whole: bool) -> bool {
        if self.receive != Receive::Own || self.recv_armed || self.finished() {
            return false;
        }
        let len = area.len().min(u32::MAX as usize) as u32;
        let flags = if whole { libc::MSG_WAITALL } else { 0 };
        let entry = opcode::Recv::new(types::Fd(self.fd), area.as_mut_ptr(), len)
            .flags(flags)
            .build()
            .user_data(user_data(self.slot, Op::Recv));
        self.shared.push(entry);
        self.recv_armed = true;
        true
    }

    /// Takes the completion of a receive into the reader's own buffer:
    /// how many bytes it wrote there (0 at the end of the stream or on an
    /// error, which [`Socket::ended`] then reports).
    pub fn received_own(&mut self, result: i32) -> usize {
        self.recv_armed = false;
        match result {
            n if n > 0 => n as usize,
            0 => {
                self.eof = true;
                0
            }
            e if -e == libc::ECANCELED => 0,
            e => {
                self.fail(&io::Error::from_raw_os_error(-e));
                0
            }
        }
    }

    /// How the stream ended, once it has: `Ok` at its end, the receive's
    /// error after it failed.
    pub fn ended(&self) -> Option<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Some(Err(io::Error::new(kind, self.failure.clone())));
        }
        self.eof.then_some(Ok(()))
    }

    /// Marks the stream failed with `error`: the reader reads it next.
    pub fn fail(&mut self, error: &io::Error) {
        self.failed = Some(error.kind());
        self.failure = error.to_string();
    }

    /// Whether the stream ended or failed.
    pub fn finished(&self) -> bool {
        self.eof || self.failed.is_some()
    }

    /// Keeps `buffer`, which a receive started by
    /// [`Socket::receive_into`] may still write into, until that receive
    /// ends (cancelled here); call before the socket and the buffer's
    /// owner are dropped. A receive not submitted yet is taken back
    /// instead, and `buffer` dropped.
    pub fn bury(&mut self, buffer: Vec<u8>) {
        if !self.recv_armed {
            return;
        }
        self.recv_armed = false;
        let key = user_data(self.slot, Op::Recv);
        let mut outbox = self.shared.outbox.borrow_mut();
        let queued = outbox.len();
        outbox.retain(|entry| entry.get_user_data() != key);
        if outbox.len() < queued {
            return;
        }
        drop(outbox);
        self.shared.graveyard.borrow_mut().insert(key, buffer);
        let entry = opcode::AsyncCancel::new(key)
            .build()
            .user_data(user_data(self.slot, Op::Cancel));
        self.shared.push(entry);
    }

    /// Takes a receive completion: `result` and the bytes it carries.
    /// With nothing staged the bytes are not copied: the reader reads them
    /// where they are until [`Socket::settle`].
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged until `settle` is called on
    /// this socket or it is dropped (the provided buffer is handed back to
    /// the kernel only after that).
    pub unsafe fn received(&mut self, result: i32, bytes: &[u8], more: bool) {
        if !more {
            self.recv_armed = false;
        }
        match result {
            n if n > 0 => {
                // A buffer still lent is older than these bytes.
                self.settle();
                if self.staged_pos == self.staged.len() {
                    self.staged.clear();
                    self.staged_pos = 0;
                    self.lent = Some(Lent {
                        ptr: bytes.as_ptr(),
                        len: bytes.len(),
                        pos: 0,
                    });
                } else {
                    self.staged.extend_from_slice(bytes);
                }
            }
            0 => self.eof = true,
            e if -e == libc::ENOBUFS || -e == libc::ECANCELED => {}
            e => self.fail(&io::Error::from_raw_os_error(-e)),
        }
        if self.staged() >= STAGED_HIGH && self.recv_armed && !self.cancelling {
            // The reader is paused: stop taking buffers for it.
            let entry = opcode::AsyncCancel::new(user_data(self.slot, Op::Recv))
                .build()
                .user_data(user_data(self.slot, Op::Cancel));
            self.shared.push(entry);
            self.cancelling = true;
            // Still notice a peer that goes away meanwhile.
            let hangup = (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) as u32;
            let entry = opcode::PollAdd::new(types::Fd(self.fd), hangup)
                .build()
                .user_data(user_data(self.slot, Op::Hangup));
            self.shared.push(entry);
        }
        if !self.recv_armed {
            if self.leaving {
                self.leaving = false;
                self.receive = Receive::Own;
            } else {
                self.arm();
            }
        }
    }

    /// Ends the loan of the buffer [`Socket::received`] lent: the bytes the
    /// reader did not take are copied into the staging area. Call before
    /// the buffer goes back to the kernel.
    pub fn settle(&mut self) {
        let Some(lent) = self.lent.take() else {
            return;
        };
        if lent.remaining() > 0 {
            // SAFETY: `received`'s caller keeps the lent bytes valid until
            // this call; `pos <= len`, so the range is within them.
            let rest =
                unsafe { std::slice::from_raw_parts(lent.ptr.add(lent.pos), lent.remaining()) };
            // Nothing is staged while a buffer is lent.
            self.staged.extend_from_slice(rest);
        }
    }

    /// Hands `out` to a send unless one is in flight (it takes `out`'s
    /// bytes and leaves it empty).
    pub fn send(&mut self, out: &mut Vec<u8>) {
        if self.send_busy || out.is_empty() {
            return;
        }
        self.sending.clear();
        std::mem::swap(out, &mut self.sending);
        self.send_pos = 0;
        self.send_busy = true;
        self.submit_send();
    }

    fn submit_send(&mut self) {
        let rest = &self.sending[self.send_pos..];
        let len = rest.len().min(u32::MAX as usize) as u32;
        let entry = opcode::Send::new(types::Fd(self.fd), rest.as_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(user_data(self.slot, Op::Send));
        self.shared.push(entry);
    }

    /// Takes a send completion; sends the rest, then what `out` gathered
    /// meanwhile.
    pub fn sent(&mut self, result: i32, out: &mut Vec<u8>) -> io::Result<()> {
        if result < 0 {
            self.send_busy = false;
            return Err(io::Error::from_raw_os_error(-result));
        }
        if result == 0 {
            self.send_busy = false;
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.send_pos += result as usize;
        if self.send_pos < self.sending.len() {
            self.submit_send();
            return Ok(());
        }
        self.send_busy = false;
        self.sending.clear();
        if self.sending.capacity() > 4 * STAGED_HIGH {
            self.sending = Vec::new();
        }
        self.send(out);
        Ok(())
    }

    /// Frees the buffers of an idle socket (nothing staged or in flight).
    pub fn trim(&mut self) {
        if self.staged() == 0 {
            self.staged = Vec::new();
            self.staged_pos = 0;
        }
        if !self.send_busy {
            self.sending = Vec::new();
        }
    }
}

impl Read for Socket {
    /// Reads the lent buffer's bytes, then staged ones; `WouldBlock` when
    /// there are none (yet), `Ok(0)` at the end of the stream, the
    /// receive's error after it failed.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(lent) = &mut self.lent
            && lent.remaining() > 0
        {
            let n = lent.remaining().min(buf.len());
            // SAFETY: `received`'s caller keeps the lent bytes valid until
            // `settle`, which takes the loan; `pos + n <= len`.
            let rest = unsafe { std::slice::from_raw_parts(lent.ptr.add(lent.pos), n) };
            buf[..n].copy_from_slice(rest);
            lent.pos += n;
            return Ok(n);
        }
        let rest = &self.staged[self.staged_pos..];
        if rest.is_empty() {
            return match self.ended() {
                Some(ended) => ended.map(|()| 0),
                None => Err(io::ErrorKind::WouldBlock.into()),
            };
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.staged_pos += n;
        if self.staged_pos == self.staged.len() {
            self.staged.clear();
            self.staged_pos = 0;
        }
        Ok(n)
    }
}

impl Drop for Socket {
    /// Entries not submitted yet are taken back: the descriptor they name
    /// is closed with the socket and its number may be reused at once.
    /// One in flight is cancelled (a receive) or left to complete from a
    /// buffer kept until then (a send).
    fn drop(&mut self) {
        let mut unsent = Vec::new();
        self.shared.outbox.borrow_mut().retain(|entry| {
            // A cancellation names no descriptor: it goes out (`bury`
            // queued one for a receive into a buffer kept meanwhile).
            let data = entry.get_user_data();
            let ours = data >> 3 == self.slot && data & 7 != Op::Cancel as u64;
            if ours {
                unsent.push(entry.get_user_data() & 7);
            }
            !ours
        });
        if unsent.contains(&(Op::Send as u64)) {
            self.send_busy = false;
        }
        if unsent.contains(&(Op::Recv as u64)) {
            self.recv_armed = false;
        }
        if self.send_busy {
            self.shared.graveyard.borrow_mut().insert(
                user_data(self.slot, Op::Send),
                std::mem::take(&mut self.sending),
            );
        }
        if self.recv_armed {
            let entry = opcode::AsyncCancel::new(user_data(self.slot, Op::Recv))
                .build()
                .user_data(user_data(self.slot, Op::Cancel));
            self.shared.push(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket() -> (Rc<Shared>, Socket) {
        let shared = Rc::new(Shared::default());
        let socket = Socket::new(&shared, 7, Receive::Shared);
        (shared, socket)
    }

    /// A receive completion of `bytes`, settled at once (as the device
    /// does once the reader has had its turn).
    fn take(s: &mut Socket, result: i32, bytes: &[u8], more: bool) {
        // SAFETY: the loan ends (settle) before `bytes` can go away.
        unsafe { s.received(result, bytes, more) };
        s.settle();
    }

    fn ops(shared: &Shared) -> Vec<u64> {
        shared
            .outbox
            .borrow_mut()
            .drain(..)
            .map(|e| e.get_user_data() & 7)
            .collect()
    }

    #[test]
    fn user_data_names_slot_and_operation() {
        let c = Completion {
            user_data: user_data(41, Op::Send),
            result: 0,
            flags: 0,
        };
        assert_eq!((c.slot(), c.op()), (41, Some(Op::Send)));
        let sockets = [socket().1, socket().1];
        assert_ne!(sockets[0].slot(), 0, "slot 0 is the watch's");
    }

    #[test]
    fn staged_bytes_read_out_then_would_block_then_end() {
        let (shared, mut s) = socket();
        s.arm();
        assert_eq!(ops(&shared), vec![Op::Recv as u64]);
        take(&mut s, 5, b"hello", true);
        let mut buf = [0; 3];
        assert_eq!(s.read(&mut buf).expect("read"), 3);
        assert_eq!(s.read(&mut buf).expect("read"), 2);
        assert_eq!(&buf[..2], b"lo");
        let e = s.read(&mut buf).expect_err("empty");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        take(&mut s, 0, &[], false);
        assert_eq!(s.read(&mut buf).expect("eof"), 0);
        assert!(ops(&shared).is_empty(), "no receive after the end");
    }

    #[test]
    fn lent_bytes_are_read_where_they_are_and_the_unread_rest_is_staged_in_order() {
        let (_shared, mut s) = socket();
        let first = *b"abcdef";
        // SAFETY: `first` outlives the loan, which `settle` ends below.
        unsafe { s.received(6, &first, true) };
        assert!(s.staged.is_empty(), "nothing copied while lent");
        assert_eq!(s.staged(), 6);
        let mut buf = [0; 4];
        assert_eq!(s.read(&mut buf).expect("read"), 4);
        assert_eq!(&buf, b"abcd");
        s.settle();
        assert_eq!(s.staged, b"ef", "the unread rest is copied");
        take(&mut s, 3, b"ghi", true);
        let mut all = [0; 8];
        assert_eq!(s.read(&mut all).expect("read"), 5);
        assert_eq!(
            &all[..5],
            b"efghi",
            "staged bytes first, then the later ones"
        );
        take(&mut s, 2, b"jk", true);
        assert_eq!(s.read(&mut all).expect("read"), 2);
        assert_eq!(&all[..2], b"jk");
        assert_eq!(s.staged(), 0);
        assert!(s.staged.is_empty());
    }

    #[test]
    fn a_paused_reader_stops_receiving_and_starts_again_once_read() {
        let (shared, mut s) = socket();
        s.arm();
        ops(&shared);
        let chunk = vec![0u8; BUFFER_LEN];
        while s.staged() < STAGED_HIGH {
            take(&mut s, BUFFER_LEN as i32, &chunk, true);
        }
        assert_eq!(
            ops(&shared),
            vec![Op::Cancel as u64, Op::Hangup as u64],
            "cancelled once, watching for a hang-up"
        );
        take(&mut s, BUFFER_LEN as i32, &chunk, true);
        assert!(ops(&shared).is_empty(), "already cancelling");
        take(&mut s, -libc::ECANCELED, &[], false);
        assert!(ops(&shared).is_empty(), "not armed while staged is high");
        assert!(!s.receiving());
        let mut sink = vec![0u8; 1 << 20];
        while s.read(&mut sink).is_ok() {}
        s.arm();
        assert_eq!(ops(&shared), vec![Op::Recv as u64]);
    }

    #[test]
    fn a_socket_leaves_the_shared_buffers_only_once_its_multishot_receive_ended() {
        let (shared, mut s) = socket();
        s.arm();
        ops(&shared);
        s.leave_shared();
        assert_eq!(ops(&shared), vec![Op::Cancel as u64]);
        s.leave_shared();
        s.arm();
        assert!(ops(&shared).is_empty(), "cancelled once, not armed again");
        // Bytes the receive took before the cancellation are read first.
        take(&mut s, 3, b"abc", true);
        assert_eq!(s.receive(), Receive::Shared);
        let mut area = [0u8; 8];
        // SAFETY: nothing is submitted; the entry is dropped with `shared`.
        assert!(!unsafe { s.receive_into(&mut area, false) }, "not yet");
        take(&mut s, -libc::ECANCELED, &[], false);
        assert_eq!(s.receive(), Receive::Own);
        assert!(ops(&shared).is_empty(), "no multishot receive again");
        assert_eq!(s.read(&mut area).expect("staged"), 3);
        // SAFETY: as above.
        assert!(unsafe { s.receive_into(&mut area, true) });
        assert_eq!(ops(&shared), vec![Op::Recv as u64]);
        s.return_home();
        assert_eq!(s.receive(), Receive::Own, "not while its receive runs");
        assert_eq!(s.received_own(8), 8);
        s.return_home();
        assert_eq!(s.receive(), Receive::Shared);
        assert_eq!(ops(&shared), vec![Op::Recv as u64], "multishot again");
        let (_, mut idle) = socket();
        idle.leave_shared();
        assert_eq!(idle.receive(), Receive::Own, "at once with no receive");
    }

    #[test]
    fn a_receive_out_of_buffers_is_armed_again_and_an_error_is_read() {
        let (shared, mut s) = socket();
        s.arm();
        ops(&shared);
        take(&mut s, -libc::ENOBUFS, &[], false);
        assert_eq!(ops(&shared), vec![Op::Recv as u64]);
        take(&mut s, -libc::ECONNRESET, &[], false);
        let e = s.read(&mut [0; 4]).expect_err("failed");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert!(ops(&shared).is_empty());
    }

    #[test]
    fn one_send_in_flight_short_sends_finish_and_later_bytes_follow() {
        let (shared, mut s) = socket();
        let mut out = b"abcdef".to_vec();
        s.send(&mut out);
        assert!(out.is_empty());
        assert_eq!(s.sending(), 6);
        out.extend_from_slice(b"gh");
        s.send(&mut out);
        assert_eq!(out, b"gh", "waits for the send in flight");
        assert_eq!(ops(&shared), vec![Op::Send as u64]);
        s.sent(4, &mut out).expect("short");
        assert_eq!(s.sending(), 2);
        assert_eq!(ops(&shared), vec![Op::Send as u64], "the rest");
        s.sent(2, &mut out).expect("done");
        assert_eq!(s.sending(), 2, "then the bytes gathered meanwhile");
        assert!(out.is_empty());
        assert!(s.sent(-libc::EPIPE, &mut out).is_err());
    }

    #[test]
    fn a_socket_closed_before_its_entries_went_out_takes_them_back() {
        let (shared, mut s) = socket();
        let other = Socket::new(&shared, 8, Receive::Shared);
        s.arm();
        let mut out = vec![1u8; 100];
        s.send(&mut out);
        let keep = opcode::Nop::new()
            .build()
            .user_data(user_data(other.slot(), Op::Send));
        shared.push(keep);
        let slot = s.slot();
        drop(s);
        assert!(
            !shared
                .graveyard
                .borrow()
                .contains_key(&user_data(slot, Op::Send))
        );
        assert_eq!(
            ops(&shared),
            vec![Op::Send as u64],
            "only the other socket's"
        );
    }

    #[test]
    fn a_socket_closed_mid_send_keeps_its_buffer_until_the_send_completes() {
        let (shared, mut s) = socket();
        s.arm();
        let mut out = vec![1u8; 100];
        s.send(&mut out);
        ops(&shared); // submitted
        let slot = s.slot();
        drop(s);
        assert!(
            shared
                .graveyard
                .borrow()
                .contains_key(&user_data(slot, Op::Send))
        );
        let ops = ops(&shared);
        assert_eq!(ops.last(), Some(&(Op::Cancel as u64)), "{ops:?}");
    }

    /// Waits (up to a few seconds) for a completion of `op`.
    fn completion_of(ring: &mut Ring, op: Op) -> Completion {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            ring.wait(Duration::from_millis(100)).expect("wait");
            let mut out = Vec::new();
            ring.reap(&mut out);
            if let Some(c) = out.into_iter().find(|c| c.op() == Some(op)) {
                return c;
            }
            assert!(std::time::Instant::now() < deadline, "no {op:?} completion");
        }
    }

    #[test]
    fn a_receive_into_the_readers_buffer_lands_there_once() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let mut ring = Ring::new(false).expect("io_uring");
        let (mut peer, ours) = std::os::unix::net::UnixStream::pair().expect("pair");
        let mut s = Socket::new(ring.shared(), ours.as_raw_fd(), Receive::Own);
        s.arm();
        assert!(
            ring.shared.outbox.borrow().is_empty(),
            "no multishot receive"
        );
        let mut area = vec![0u8; 8];
        // SAFETY: `area` outlives the receive, whose completion is taken below.
        assert!(unsafe { s.receive_into(&mut area, true) });
        // SAFETY: as above.
        assert!(!unsafe { s.receive_into(&mut area, true) }, "one at a time");
        peer.write_all(b"abc").expect("write");
        peer.write_all(b"defgh").expect("write");
        let c = completion_of(&mut ring, Op::Recv);
        assert_eq!(c.buffer(), None, "no provided buffer taken");
        assert_eq!(s.received_own(c.result), 8, "whole: both writes");
        assert_eq!(&area, b"abcdefgh");
        // SAFETY: as above.
        assert!(unsafe { s.receive_into(&mut area, false) });
        peer.write_all(b"xy").expect("write");
        let c = completion_of(&mut ring, Op::Recv);
        assert_eq!(s.received_own(c.result), 2, "what there is");
        assert_eq!(&area[..2], b"xy");
        drop(peer);
        // SAFETY: as above.
        assert!(unsafe { s.receive_into(&mut area, false) });
        let c = completion_of(&mut ring, Op::Recv);
        assert_eq!(s.received_own(c.result), 0);
        assert!(matches!(s.ended(), Some(Ok(()))));
    }

    #[test]
    fn a_buffer_buried_mid_receive_is_kept_until_the_receive_ends() {
        use std::os::fd::AsRawFd;
        let mut ring = Ring::new(false).expect("io_uring");
        let (_peer, ours) = std::os::unix::net::UnixStream::pair().expect("pair");
        let mut s = Socket::new(ring.shared(), ours.as_raw_fd(), Receive::Own);
        let mut buffer = vec![0u8; 64];
        // SAFETY: `buffer` is buried below before it could be dropped.
        assert!(unsafe { s.receive_into(&mut buffer, false) });
        let key = user_data(s.slot(), Op::Recv);
        // Not submitted yet: taken back, nothing kept.
        s.bury(std::mem::take(&mut buffer));
        assert!(ring.shared.outbox.borrow().is_empty());
        assert!(ring.shared.graveyard.borrow().is_empty());
        let mut buffer = vec![0u8; 64];
        // SAFETY: as above.
        assert!(unsafe { s.receive_into(&mut buffer, false) });
        ring.wait(Duration::ZERO).expect("submit");
        s.bury(buffer);
        drop(s);
        assert!(ring.shared.graveyard.borrow().contains_key(&key));
        let c = completion_of(&mut ring, Op::Recv);
        assert_eq!(c.result, -libc::ECANCELED);
        ring.release(&c);
        assert!(
            ring.shared.graveyard.borrow().is_empty(),
            "freed once ended"
        );
    }
}
