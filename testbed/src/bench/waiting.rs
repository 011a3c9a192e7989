//! How one end of a round trip waits for the other's message: sleeping in
//! the kernel, or polling its socket. On a virtual machine a sleeping end
//! pays a wake-up per message (tens of microseconds when its CPU was
//! idle); a polling end pays a CPU kept busy instead.

/// How an end waits for its next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// A blocking read: the thread sleeps until bytes arrive.
    Sleep,
    /// A non-blocking socket read again and again until bytes arrive: the
    /// thread never sleeps and keeps its CPU busy.
    Spin,
}
