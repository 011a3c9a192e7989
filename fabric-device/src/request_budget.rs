//! Bytes of requests a fabric device holds while they arrive.
//!
//! A connection's frame decoder holds the requests it has read and not yet
//! handed on, and the frame being received. Each connection is charged
//! what it will hold once that frame is in; the charges of one client's
//! connections together stay within a per-client budget, and all
//! connections' within the device's. A connection whose next large frame
//! does not fit is not read until others' frames have been handled, so a
//! client that starts many large frames and never finishes them holds its
//! own budget, not the device's memory.

use std::collections::HashMap;

use crate::idmap::IdMap;
use crate::ids::ConnId;

/// What one connection is charged, and to which client.
#[derive(Debug, Default)]
struct Charge {
    bytes: u64,
    /// The client the bytes are booked to (none before HELLO).
    client: Option<String>,
}

/// The charges of every connection against the budgets.
#[derive(Debug)]
pub struct RequestBudget {
    per_client: u64,
    limit: u64,
    total: u64,
    by_client: HashMap<String, u64>,
    by_conn: IdMap<ConnId, Charge>,
}

impl RequestBudget {
    /// Budgets of `per_client` bytes for each client's connections together
    /// and `limit` bytes for all connections.
    pub fn new(per_client: u64, limit: u64) -> Self {
        Self {
            per_client,
            limit,
            total: 0,
            by_client: HashMap::new(),
            by_conn: IdMap::default(),
        }
    }

    /// Charges `conn` (of `client`, once known) `bytes` instead of what it
    /// was charged. With `admit`, a charge that grows past either budget is
    /// refused: nothing changes and the answer is false. Without, the
    /// charge is recorded as it is (bytes already read).
    pub fn charge(&mut self, conn: ConnId, client: Option<&str>, bytes: u64, admit: bool) -> bool {
        let charge = self.by_conn.entry(conn).or_default();
        let old = charge.bytes;
        let same_client = charge.client.as_deref() == client;
        if same_client && bytes == old {
            return true;
        }
        let booked = |name: &str| self.by_client.get(name).copied().unwrap_or(0);
        if admit && bytes > old {
            // What the client's other connections hold, plus this one's new charge.
            let client_total = client.map(|name| match same_client {
                true => booked(name) - old + bytes,
                false => booked(name) + bytes,
            });
            if client_total.is_some_and(|t| t > self.per_client)
                || self.total - old + bytes > self.limit
            {
                return false;
            }
        }
        match (same_client, client) {
            (true, Some(name)) => {
                if let Some(sum) = self.by_client.get_mut(name) {
                    *sum = *sum - old + bytes;
                }
            }
            (true, None) => {}
            (false, _) => {
                if let Some(was) = charge.client.take() {
                    let sum = self.by_client.remove(&was).unwrap_or(0);
                    if sum > old {
                        self.by_client.insert(was, sum - old);
                    }
                }
                if let Some(name) = client {
                    *self.by_client.entry(name.to_owned()).or_default() += bytes;
                    charge.client = Some(name.to_owned());
                }
            }
        }
        charge.bytes = bytes;
        self.total = self.total - old + bytes;
        true
    }

    /// Drops `conn`'s charge (its connection closed).
    pub fn release(&mut self, conn: ConnId) {
        self.charge(conn, None, 0, false);
        self.by_conn.remove(&conn);
    }

    /// Bytes charged over all connections.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes charged to `client`'s connections.
    #[cfg(test)]
    pub fn of_client(&self, client: &str) -> u64 {
        self.by_client.get(client).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_stays_within_its_budget_and_all_within_the_devices() {
        let mut budget = RequestBudget::new(100, 150);
        assert!(budget.charge(1, Some("a"), 60, true));
        assert!(budget.charge(2, Some("a"), 40, true));
        assert!(!budget.charge(3, Some("a"), 1, true), "a's budget is full");
        assert!(
            budget.charge(1, Some("a"), 50, true),
            "shrinking always fits"
        );
        assert!(budget.charge(3, Some("a"), 10, true));
        assert_eq!(budget.of_client("a"), 100);
        // b has its own budget, but the device's is what is left of 150.
        assert!(!budget.charge(4, Some("b"), 60, true));
        assert!(budget.charge(4, Some("b"), 50, true));
        assert_eq!(budget.total(), 150);
        // Bytes already read are recorded even past the budgets.
        assert!(budget.charge(4, Some("b"), 70, false));
        assert_eq!(budget.total(), 170);
        budget.release(4);
        budget.release(1);
        assert_eq!((budget.total(), budget.of_client("a")), (50, 50));
        assert_eq!(budget.of_client("b"), 0);
    }

    #[test]
    fn bytes_charged_before_hello_move_to_the_client_that_says_it() {
        let mut budget = RequestBudget::new(100, 1000);
        assert!(budget.charge(1, None, 30, true));
        assert_eq!(budget.of_client("a"), 0);
        assert!(budget.charge(1, Some("a"), 30, true));
        assert_eq!(budget.of_client("a"), 30);
        assert!(budget.charge(1, Some("a"), 100, true));
        assert!(!budget.charge(1, Some("a"), 101, true));
        budget.release(1);
        assert_eq!((budget.total(), budget.of_client("a")), (0, 0));
    }
}
