//! Which client connections the device lets in, and what they count
//! against.
//!
//! With client authentication, a connection counts against `--max-clients`
//! (and, in the core, against its client's `--max-connections-per-client`)
//! only once it has proven its key. Until then it counts against
//! `--max-unproven`, and a new connection beyond that cap closes the oldest
//! unproven one: sockets that say HELLO as some client and never prove it
//! can neither fill the device nor make it refuse that client. Without
//! authentication there is nothing to prove, and every connection counts
//! against `--max-clients` from its accept.

use std::collections::BTreeSet;

use crate::forward::ConnId;

/// The caps on client connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Proven connections (every connection without authentication).
    pub proven: usize,
    /// Connections that have not proven their key yet.
    pub unproven: usize,
}

/// What to do with a connection that was just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Admit,
    /// Serve it, and close this older unproven connection to make room.
    AdmitEvicting(ConnId),
    /// Close it; the reason labels `fabric_device_connections_closed_total`.
    Refuse(&'static str),
}

/// The client connections' standing with the caps.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    /// Whether clients must prove a key.
    proof_required: bool,
    /// Every client connection served.
    open: usize,
    /// Those that have not proven their key, oldest first (numbers grow).
    unproven: BTreeSet<ConnId>,
}

impl Admission {
    /// No connections yet.
    pub fn new(limits: Limits, proof_required: bool) -> Self {
        Self {
            limits,
            proof_required,
            open: 0,
            unproven: BTreeSet::new(),
        }
    }

    /// Whether a connection accepted now may be served.
    pub fn verdict(&self) -> Verdict {
        if !self.proof_required {
            return match self.open >= self.limits.proven {
                true => Verdict::Refuse("too_many_clients"),
                false => Verdict::Admit,
            };
        }
        if self.limits.unproven == 0 {
            return Verdict::Refuse("too_many_unproven");
        }
        match self.unproven.first() {
            Some(&oldest) if self.unproven.len() >= self.limits.unproven => {
                Verdict::AdmitEvicting(oldest)
            }
            _ => Verdict::Admit,
        }
    }

    /// Connection `conn` is served from now on (unproven, when proofs are
    /// required).
    pub fn opened(&mut self, conn: ConnId) {
        self.open += 1;
        if self.proof_required {
            self.unproven.insert(conn);
        }
    }

    /// Whether `conn` still has to prove its key.
    pub fn is_unproven(&self, conn: ConnId) -> bool {
        self.unproven.contains(&conn)
    }

    /// Unproven connection `conn` proved its key: from now on it counts as
    /// proven. False when `--max-clients` proven connections are already
    /// open: close it.
    pub fn proven(&mut self, conn: ConnId) -> bool {
        if !self.unproven.remove(&conn) {
            return true;
        }
        self.open - self.unproven.len() <= self.limits.proven
    }

    /// Connection `conn` was closed.
    pub fn closed(&mut self, conn: ConnId) {
        self.open = self.open.saturating_sub(1);
        self.unproven.remove(&conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        proven: 2,
        unproven: 3,
    };

    #[test]
    fn without_authentication_every_connection_counts_against_max_clients() {
        let mut admission = Admission::new(LIMITS, false);
        for conn in 0..2 {
            assert_eq!(admission.verdict(), Verdict::Admit);
            admission.opened(conn);
            assert!(!admission.is_unproven(conn));
        }
        assert_eq!(admission.verdict(), Verdict::Refuse("too_many_clients"));
        admission.closed(0);
        assert_eq!(admission.verdict(), Verdict::Admit);
    }

    #[test]
    fn unproven_connections_never_fill_the_proven_slots() {
        let mut admission = Admission::new(LIMITS, true);
        // Many strangers: each beyond the third evicts the oldest.
        for conn in 0..64 {
            let verdict = admission.verdict();
            if conn < 3 {
                assert_eq!(verdict, Verdict::Admit);
            } else {
                assert_eq!(verdict, Verdict::AdmitEvicting(conn - 3));
                admission.closed(conn - 3);
            }
            admission.opened(conn);
        }
        // A real client gets in, evicting a stranger, and proves its key.
        assert_eq!(admission.verdict(), Verdict::AdmitEvicting(61));
        admission.closed(61);
        admission.opened(100);
        assert!(admission.is_unproven(100));
        assert!(admission.proven(100));
        assert!(!admission.is_unproven(100));
    }

    #[test]
    fn a_proof_past_max_clients_is_not_kept() {
        let mut admission = Admission::new(LIMITS, true);
        for conn in 0..3 {
            admission.opened(conn);
        }
        assert!(admission.proven(0));
        assert!(admission.proven(1));
        assert!(!admission.proven(2), "two proven already");
        admission.closed(2);
        admission.closed(0);
        admission.opened(3);
        assert!(admission.proven(3));
    }
}
