//! What a client may hold in the forwarding core: requests in flight, bytes
//! of answers on the way, and bytes of requests still arriving (backpressure
//! the driver applies by not reading a connection).

use super::{ConnId, Forwarder};

impl Forwarder {
    /// Charges `conn` the bytes of requests its connection will hold once
    /// the frame it is receiving is in (see [`RequestBudget`]). With
    /// `admit`, a charge past its client's or the device's budget is
    /// refused and false returned: the driver stops reading the connection
    /// until there is room. Without, what was read is recorded as it is.
    pub fn charge_request_bytes(&mut self, conn: ConnId, bytes: u64, admit: bool) -> bool {
        let client = self
            .sessions
            .get(&conn)
            .and_then(|s| s.client.as_ref())
            .map(|(name, _)| name.as_str());
        let charged = self.request_budget.charge(conn, client, bytes, admit);
        if !charged {
            self.metrics.request_budget_waits.inc();
        }
        self.metrics
            .request_bytes_held
            .set(self.request_budget.total() as i64);
        charged
    }

    /// Whether `conn` may send another request now (backpressure).
    pub fn client_has_room(&self, conn: ConnId) -> bool {
        self.sessions.get(&conn).is_some_and(|s| {
            s.in_flight == 0
                || (s.in_flight < self.config.max_in_flight_per_client
                    && s.reply_bytes < self.config.max_reply_bytes_per_client
                    && self.reply_bytes < self.config.max_reply_bytes_total)
        })
    }
}
