//! The live data connections: how many there are, which have proven their
//! key, and a handle on each socket so that shutdown, or an eviction, can
//! end its reads.
//!
//! A connection counts against `--max-connections` only once it is
//! proven (with `--secrets`; without, from its accept). Until then it
//! counts against `--max-unproven`, and a new connection beyond that cap
//! closes the oldest unproven one: sockets that say HELLO and never prove
//! anything cannot fill the server, and cannot hold the slot a real peer
//! needs for longer than it takes that peer to open one.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How many connections may be live at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections that proved their key (all, without authentication).
    pub proven: usize,
    /// Connections that have not proven their key yet.
    pub unproven: usize,
}

/// Where a connection stands with the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Unproven,
    Proven,
    /// Evicted or refused: its thread is ending, it counts nowhere.
    Leaving,
}

#[derive(Debug, Default)]
struct Live {
    sockets: HashMap<u64, (TcpStream, Standing)>,
    /// The unproven connections, oldest first (numbers only grow).
    unproven: BTreeSet<u64>,
    proven: usize,
    next: u64,
    /// Shutdown began: no new connection is admitted.
    closing: bool,
}

/// The live data connections, shared by the accept loops and the
/// connection threads.
#[derive(Debug, Default)]
pub struct LiveConnections {
    state: Mutex<Live>,
    gone: Condvar,
}

/// Why a connection was not admitted.
#[derive(Debug)]
pub enum Refusal {
    /// The cap its standing counts against is reached.
    Full,
    /// Shutdown began.
    Closing,
    /// Its socket cannot be shared with the registry.
    Io(io::Error),
}

/// A connection let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Its number, for [`LiveConnections::promote`] and
    /// [`LiveConnections::remove`].
    pub id: u64,
    /// Whether the oldest unproven connection was closed to make room.
    pub evicted_oldest: bool,
}

impl LiveConnections {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `stream`, as proven when there is nothing to prove (no
    /// authentication). A proven one is refused at `limits.proven`; an
    /// unproven one at `limits.unproven` closes the oldest unproven
    /// connection instead (its reads end at once).
    pub fn try_add(
        &self,
        limits: Limits,
        stream: &TcpStream,
        proven: bool,
    ) -> Result<Admitted, Refusal> {
        let mut live = self.lock();
        if live.closing {
            return Err(Refusal::Closing);
        }
        let mut evicted_oldest = false;
        if proven {
            if live.proven >= limits.proven {
                return Err(Refusal::Full);
            }
        } else {
            if limits.unproven == 0 {
                return Err(Refusal::Full);
            }
            while live.unproven.len() >= limits.unproven {
                let Some(oldest) = live.unproven.pop_first() else {
                    break;
                };
                if let Some((socket, standing)) = live.sockets.get_mut(&oldest) {
                    *standing = Standing::Leaving;
                    let _ = socket.shutdown(Shutdown::Both);
                }
                evicted_oldest = true;
            }
        }
        let handle = stream.try_clone().map_err(Refusal::Io)?;
        let id = live.next;
        live.next += 1;
        let standing = if proven {
            live.proven += 1;
            Standing::Proven
        } else {
            live.unproven.insert(id);
            Standing::Unproven
        };
        live.sockets.insert(id, (handle, standing));
        Ok(Admitted { id, evicted_oldest })
    }

    /// Connection `id` proved its key: from now on it counts against
    /// `max_proven`. False when it may not stay: it was evicted meanwhile,
    /// or `max_proven` proven connections are live.
    pub fn promote(&self, id: u64, max_proven: usize) -> bool {
        let mut live = self.lock();
        if !live.unproven.remove(&id) {
            return false;
        }
        let full = live.proven >= max_proven;
        if !full {
            live.proven += 1;
        }
        if let Some((_, standing)) = live.sockets.get_mut(&id) {
            *standing = if full {
                Standing::Leaving
            } else {
                Standing::Proven
            };
        }
        !full
    }

    /// Connection `id` ended.
    pub fn remove(&self, id: u64) {
        let mut live = self.lock();
        match live.sockets.remove(&id).map(|(_, standing)| standing) {
            Some(Standing::Proven) => live.proven -= 1,
            Some(Standing::Unproven) => {
                live.unproven.remove(&id);
            }
            Some(Standing::Leaving) | None => {}
        }
        drop(live);
        self.gone.notify_all();
    }

    /// Admits no more connections and ends every live connection's reads:
    /// a read blocked in the kernel returns at once, and each connection
    /// answers what it already received before it closes.
    pub fn close_reads(&self) {
        let mut live = self.lock();
        live.closing = true;
        for (socket, _) in live.sockets.values() {
            let _ = socket.shutdown(Shutdown::Read);
        }
    }

    /// Waits until no connection is live, or `limit` passes.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let live = self.lock();
        let (live, _) = self
            .gone
            .wait_timeout_while(live, limit, |l| !l.sockets.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        live.sockets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use super::*;

    /// A connected pair: (the server's end, the peer's end).
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        (ours, peer)
    }

    const LIMITS: Limits = Limits {
        proven: 2,
        unproven: 3,
    };

    #[test]
    fn unproven_connections_never_take_a_proven_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let live = LiveConnections::default();
        let mut held = Vec::new();
        for _ in 0..10 {
            let (ours, peer) = pair(&listener);
            live.try_add(LIMITS, &ours, false).unwrap();
            held.push((ours, peer));
        }
        // Both proven slots are free, however many strangers came.
        for _ in 0..2 {
            let (ours, _peer) = pair(&listener);
            live.try_add(LIMITS, &ours, true).unwrap();
        }
        let (ours, _peer) = pair(&listener);
        assert!(matches!(
            live.try_add(LIMITS, &ours, true),
            Err(Refusal::Full)
        ));
    }

    #[test]
    fn a_new_unproven_connection_evicts_the_oldest() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let live = LiveConnections::default();
        let mut peers = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let (ours, peer) = pair(&listener);
            let admitted = live.try_add(LIMITS, &ours, false).unwrap();
            assert!(!admitted.evicted_oldest);
            ids.push(admitted.id);
            peers.push(peer);
        }
        let (ours, _peer) = pair(&listener);
        assert!(live.try_add(LIMITS, &ours, false).unwrap().evicted_oldest);
        // The oldest's socket is shut: its peer reads the end.
        peers[0]
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(peers[0].read(&mut [0u8; 8]).unwrap(), 0);
        // It may not be promoted any more; the next oldest may.
        assert!(!live.promote(ids[0], LIMITS.proven));
        assert!(live.promote(ids[1], LIMITS.proven));
        live.remove(ids[0]);
        live.remove(ids[1]);
    }

    #[test]
    fn promotion_counts_against_the_proven_cap() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let live = LiveConnections::default();
        let mut ids = Vec::new();
        let mut held = Vec::new();
        for _ in 0..3 {
            let (ours, peer) = pair(&listener);
            ids.push(live.try_add(LIMITS, &ours, false).unwrap().id);
            held.push((ours, peer));
        }
        assert!(live.promote(ids[0], LIMITS.proven));
        assert!(live.promote(ids[1], LIMITS.proven));
        assert!(!live.promote(ids[2], LIMITS.proven), "two proven already");
        // A proven connection that ends frees its slot.
        live.remove(ids[0]);
        let (ours, _peer) = pair(&listener);
        live.try_add(LIMITS, &ours, true).unwrap();
        live.remove(ids[1]);
        live.remove(ids[2]);
    }
}
