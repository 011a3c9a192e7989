//! How the event loop moves the bytes of the TCP client ports and server
//! links: readiness with epoll (mio), or completions on one io_uring.
//!
//! - `choice`: which back end was asked for, which one runs, and why a
//!   fallback happened (decided once at start, said in one log line).
//! - `uring`: the ring, its provided-buffer ring and the per-socket state
//!   (bytes received and not yet framed, the send in flight).

pub mod choice;
pub mod uring;

pub use choice::{Backend, IoConfig, Selected};
