//! Fencing a deposed owner: a copy of a replicated region takes changes
//! only from the fabric device the server's map names as the region's
//! owner. A device proven by its key (with `--secrets`) that asks to
//! change a copy of a region another device owns is answered NOT_OWNER,
//! with the server's epoch, and counted: nothing runs, nothing enters the
//! exactly-once window.
//!
//! The owners come from the map in etcd (its replica set records), read
//! at start and with every new map. A connection that says a newer epoch
//! than the server's is not judged by owner: the server is behind its own
//! watch and cannot tell (a new owner's map). A connection at an older
//! epoch never gets this far: it is refused STALE_MAP. Without
//! authentication the server cannot tell devices apart, and without the
//! map in etcd no owner changes: nothing is judged then.

use std::sync::PoisonError;

use control::ReplicaSetRecord;
use proto::Status;
use proto::fence::Verdict;
use proto::request;
use proto::response::ResponseKind;

use super::{Executor, push_response};
use crate::gate::Session;

impl Executor {
    /// Takes the owners of replicated regions from `records` (the map's
    /// replica set records): a region without a record has no owner, and
    /// its requests are not judged by owner. Returns the devices deposed:
    /// those that owned a region this server holds a copy of and own it no
    /// more (their queue pairs are fenced, `qp_fence`).
    pub fn follow_owners(&self, records: &[ReplicaSetRecord]) -> Vec<String> {
        let owners: Vec<Option<String>> = self
            .layout
            .entries()
            .iter()
            .map(|entry| {
                records
                    .iter()
                    .find(|r| r.region == entry.region_id.as_str())
                    .map(|r| r.owner.clone())
            })
            .collect();
        let mut held = self.owners.write().unwrap_or_else(PoisonError::into_inner);
        let mut deposed: Vec<String> = Vec::new();
        for (index, before) in held.iter().enumerate() {
            let served = self.regions.get(index).is_some_and(Option::is_some);
            if let Some(before) = before
                && served
                && owners.get(index).and_then(Option::as_ref) != Some(before)
                && !deposed.contains(before)
            {
                deposed.push(before.clone());
            }
        }
        *held = owners;
        deposed
    }

    /// The owner `req`'s region has by the server's map, when a fabric
    /// device of `session`, on a connection judged `verdict`, asks to
    /// change it and is not that owner.
    pub(super) fn deposed_owner(
        &self,
        session: &Session,
        verdict: Verdict,
        req: &request::Repr<'_>,
    ) -> Option<String> {
        let Session::ProvenDevice { device } = session else {
            return None;
        };
        if verdict == Verdict::ServeAhead || !req.operation.changes_memory() {
            return None;
        }
        let (region, _, _) = self.locate(req.target)?;
        let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
        let owner = owners.get(region.entry.region.0 as usize)?.as_ref()?;
        (owner != device).then(|| owner.clone())
    }

    /// Whether fabric device `device` owns `req`'s region by the server's
    /// map: a replicated region's owner reads and writes its copies in its
    /// own name, for no client, when it resyncs a copy (READ from one copy,
    /// WRITE_PERSIST to another).
    pub(super) fn owner_asks(&self, device: &str, req: &request::Repr<'_>) -> bool {
        if !matches!(
            req.operation,
            request::Operation::Read | request::Operation::Write | request::Operation::WritePersist
        ) || req.exactly_once.is_some()
        {
            return false;
        }
        let Some((region, _, _)) = self.locate(req.target) else {
            return false;
        };
        let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
        owners
            .get(region.entry.region.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|owner| owner == device)
    }

    /// Takes the owners of replicated regions from the topology's turn
    /// order (`owners`: region, device), as every daemon does on a
    /// topology file; a map in etcd replaces them
    /// ([`Executor::follow_owners`]).
    pub fn owners_by_turn(&self, owners: &[(topology::RegionId, topology::FabricDeviceId)]) {
        let by_region = self
            .layout
            .entries()
            .iter()
            .map(|entry| {
                owners
                    .iter()
                    .find(|(region, _)| *region == entry.region_id)
                    .map(|(_, device)| device.to_string())
            })
            .collect();
        *self.owners.write().unwrap_or_else(PoisonError::into_inner) = by_region;
    }

    /// Answers `req` NOT_OWNER with the server's epoch, counted.
    pub(super) fn not_owner(&self, req: &request::Repr<'_>, tag: u64, out: &mut Vec<u8>) {
        self.metrics.not_owner.inc();
        self.metrics
            .record(req.operation, Status::NotOwner, std::time::Duration::ZERO);
        let kind = ResponseKind::answering(req.operation.opcode());
        push_response(out, tag, kind, Status::NotOwner, self.epoch(), 0);
    }
}
