//! The map epoch in the forwarding core: the epoch the device runs, the
//! one each client connection said (fenced as `proto::fence` rules), the
//! one a QP_CONNECT says for its queue pair, and the device's own
//! MAP_EPOCH on its links to servers.
//!
//! The device says its epoch on a link once the link's opening is done
//! and again on every link that is up when it applies a new epoch (on a
//! topology file, epoch 0, it says nothing). A server that answers with a
//! newer epoch than the device's (STALE_MAP, to MAP_EPOCH or to a forwarded
//! request) makes the device ask its map watcher to read the map at once.

use proto::fence::{self, ConnEpoch, Verdict};
use proto::{Message, Opcode, Status, frame, response};

use super::{ClientAction, ConnId, Forwarder, LinkId, LinkStatus, Reply};
use crate::link_tags::MAP_EPOCH_TAG;

/// The device's epoch and what servers said of theirs.
#[derive(Debug, Default)]
pub(super) struct DeviceEpoch {
    /// The epoch the device runs; 0 on a topology file.
    epoch: u64,
    /// A server runs a newer epoch: the map is to be read again now.
    reread_wanted: bool,
}

impl DeviceEpoch {
    /// The MAP_EPOCH frame for a link, when the device follows a map.
    fn link_message(&self) -> Option<Vec<u8>> {
        if self.epoch == 0 {
            return None;
        }
        Message::MapEpoch(self.epoch)
            .encode_to_vec(MAP_EPOCH_TAG)
            .ok()
    }

    /// A server answered STALE_MAP with its epoch `theirs`.
    fn server_runs(&mut self, theirs: u64) {
        if theirs > self.epoch {
            self.reread_wanted = true;
        }
    }
}

impl Forwarder {
    /// The device runs epoch `epoch` from now on (its map already applied
    /// by [`Forwarder::reload`]): client connections are judged against
    /// it, and every link that is up says it to its server (the frames to
    /// send, by link).
    pub fn set_epoch(&mut self, epoch: u64) -> Vec<(LinkId, Vec<u8>)> {
        self.epoch.epoch = epoch;
        self.fence_new_owners(epoch);
        let Some(message) = self.epoch.link_message() else {
            return Vec::new();
        };
        let said = self
            .links
            .iter()
            .filter(|(_, link)| link.status == LinkStatus::Up)
            .map(|(id, _)| (*id, message.clone()))
            .collect();
        // Parts in flight may come back STALE_MAP; parts refused so go
        // again now if their server runs this epoch (behind the MAP_EPOCH
        // just said: the driver writes it before the outbox).
        self.stale_after_epoch(std::time::Instant::now());
        said
    }

    /// The epoch the device runs (0 on a topology file).
    pub(super) fn current_epoch(&self) -> u64 {
        self.epoch.epoch
    }

    /// The epoch the device runs (0 on a topology file), which its
    /// QP_CONNECTs to servers say.
    pub fn running_epoch(&self) -> u64 {
        self.current_epoch()
    }

    /// Whether a server said it runs a newer epoch since the last call:
    /// the driver then asks its map watcher to read the map now.
    pub fn take_map_reread(&mut self) -> bool {
        std::mem::take(&mut self.epoch.reread_wanted)
    }

    /// The MAP_EPOCH to send on a link whose opening just finished.
    pub(super) fn link_opened_epoch(&self) -> Option<Vec<u8>> {
        self.epoch.link_message()
    }

    /// A client says the epoch it runs on `conn`: recorded, and answered
    /// with the device's.
    pub(super) fn map_epoch(
        &mut self,
        conn: ConnId,
        epoch: u64,
        tag: u64,
    ) -> ClientAction<'static> {
        let ours = self.epoch.epoch;
        let status = match self.sessions.get_mut(&conn) {
            Some(session) => {
                session.epoch.said(epoch);
                session.epoch.acknowledgement(ours)
            }
            None => Status::UnknownClient,
        };
        ClientAction::Reply(Reply::Error(fence::epoch_reply(
            Opcode::MapEpoch,
            tag,
            status,
            ours,
        )))
    }

    /// How a request of `conn` is to be judged; the STALE_MAP reply when it
    /// must not run at all.
    pub(super) fn fence(&self, conn: ConnId, opcode: Opcode, tag: u64) -> Result<Verdict, Reply> {
        let said = self
            .sessions
            .get(&conn)
            .map_or(ConnEpoch::default(), |s| s.epoch);
        match said.verdict(self.epoch.epoch) {
            Verdict::Stale => Err(self.stale_map(opcode, tag)),
            verdict => Ok(verdict),
        }
    }

    /// Whether the queue pair a QP_CONNECT on `conn` asks for may be set
    /// up: judged by the epoch the QP_CONNECT says, or else by the one the
    /// control connection said; STALE_MAP with the device's epoch when it
    /// is older than the device's (the client catches up and asks again).
    pub(super) fn fence_qp(&self, conn: ConnId, said: Option<u64>, tag: u64) -> Result<(), Reply> {
        match self.qp_epoch(conn, said).verdict(self.epoch.epoch) {
            Verdict::Stale => Err(self.stale_map(Opcode::QpConnect, tag)),
            _ => Ok(()),
        }
    }

    /// The epoch a queue pair set up by a QP_CONNECT on control connection
    /// `control` runs: the one the QP_CONNECT said (`said`), or else the
    /// one the control connection said.
    pub fn qp_epoch(&self, control: ConnId, said: Option<u64>) -> ConnEpoch {
        let mut epoch = self
            .sessions
            .get(&control)
            .map_or(ConnEpoch::default(), |s| s.epoch);
        if let Some(said) = said {
            epoch.said(said);
        }
        epoch
    }

    /// Queue pair session `conn` runs `epoch` (from [`Forwarder::qp_epoch`]):
    /// its requests are fenced as a connection's that said it, so once the
    /// device moves to a newer epoch every request of a queue pair set up
    /// before it is refused STALE_MAP (a remote error that breaks the
    /// queue pair: the client sets up a new one at its new epoch).
    pub fn qp_runs_epoch(&mut self, conn: ConnId, epoch: ConnEpoch) {
        if let Some(session) = self.sessions.get_mut(&conn) {
            session.epoch = epoch;
        }
    }

    /// The refusal of a request of a connection judged `verdict` that the
    /// map cannot route (`status`): STALE_MAP rather than UNMAPPED for a
    /// connection ahead of the device.
    pub(super) fn refuse(
        &self,
        verdict: Verdict,
        opcode: Opcode,
        tag: u64,
        status: Status,
    ) -> Reply {
        match fence::refusal(verdict, status) {
            Status::StaleMap => self.stale_map(opcode, tag),
            status => {
                self.metrics.record(opcode, status);
                Reply::Error(proto::error_reply(opcode, tag, status))
            }
        }
    }

    /// NOT_OWNER with the device's epoch, counted: a client on a newer
    /// map sees the device is behind it (and may own the region once it
    /// catches up), one on an older map that its map is behind.
    pub(super) fn not_owner_reply(&self, opcode: Opcode, tag: u64) -> Reply {
        self.metrics.not_owner.inc();
        self.metrics.record(opcode, Status::NotOwner);
        Reply::Error(fence::epoch_reply(
            opcode,
            tag,
            Status::NotOwner,
            self.epoch.epoch,
        ))
    }

    /// STALE_MAP with the device's epoch, counted.
    pub(super) fn stale_map(&self, opcode: Opcode, tag: u64) -> Reply {
        self.metrics.stale_map.inc();
        self.metrics.record(opcode, Status::StaleMap);
        Reply::Error(fence::epoch_reply(
            opcode,
            tag,
            Status::StaleMap,
            self.epoch.epoch,
        ))
    }

    /// Notes a server's response (relayed, or the answer to the device's
    /// own MAP_EPOCH): STALE_MAP with a newer epoch than the device's, or
    /// NOT_OWNER (the server's map names another owner of a region this
    /// device orders), asks for the map to be read again.
    pub(super) fn server_response(&mut self, frame: &[u8]) {
        let Some(body) = frame.get(frame::HEADER_LEN..) else {
            return;
        };
        let Ok(response) = response::Packet::new_checked(body) else {
            return;
        };
        match response.status() {
            Status::StaleMap => self.epoch.server_runs(response.value()),
            Status::NotOwner => self.epoch.reread_wanted = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
