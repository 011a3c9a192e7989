//! Answering an operator's SCRUB: check a run of a region's blocks against
//! their checksums ([`crate::block_sums`]), count the results in the
//! metrics and log every mismatch. And answering BLOCK_SUMS, from an
//! operator or a fabric device: the checksums of a run of blocks as they
//! are now, for comparing two copies of a region.

use proto::{Message, Opcode, RegionIndex, Status, block_sums, scrub};

use crate::block_sums::ScrubFault;
use crate::exec::Executor;
use crate::gate::Session;

impl Executor {
    /// The answer to SCRUB `req` from `session`'s peer: a SCRUB_REPORT, or
    /// an ACKNOWLEDGE with ACCESS_DENIED (not an operator), UNMAPPED (no
    /// such region here), OUT_OF_BOUNDS or IO_ERROR.
    pub(crate) fn scrub(&self, session: &Session, req: scrub::Repr) -> Message<'static> {
        let refuse = |status| proto::error_response(Opcode::Scrub, status);
        if !matches!(session, Session::Open | Session::ProvenOperator) {
            self.metrics().denied.with(&["not_operator"]).inc();
            return refuse(Status::AccessDenied);
        }
        let Some(region) = self.region(RegionIndex(req.region)) else {
            return refuse(Status::Unmapped);
        };
        let id = region.entry.region_id.as_str();
        let file = &region.file;
        match file
            .sums
            .scrub(&file.map, req.region, req.first, req.blocks)
        {
            Ok(report) => {
                let count = |result, n: u64| {
                    if n > 0 {
                        self.metrics().scrubbed_blocks.with(&[id, result]).add(n);
                    }
                };
                count("verified", report.verified.into());
                count("recorded", report.recorded.into());
                count("unwatched", report.unwatched.into());
                count("mismatch", report.mismatches.len() as u64);
                for block in &report.mismatches {
                    tracing::error!(
                        region = id,
                        "block {block} (region offset {:#x}, {} bytes) no longer matches its \
                         checksum: changed without a write this server executed",
                        block * u64::from(report.head.block_len),
                        report.head.block_len
                    );
                }
                Message::ScrubReport(report)
            }
            Err(ScrubFault::OutOfRange { .. }) => refuse(Status::OutOfBounds),
            Err(e) => {
                tracing::error!(
                    region = id,
                    "scrub failed: {}",
                    telemetry::logging::error_chain(&e)
                );
                refuse(Status::IoError)
            }
        }
    }

    /// The answer to BLOCK_SUMS `req` from `session`'s peer: a
    /// BLOCK_SUMS_REPORT, or an ACKNOWLEDGE with ACCESS_DENIED (neither an
    /// operator nor a fabric device), UNMAPPED (no such region here),
    /// OUT_OF_BOUNDS or IO_ERROR.
    pub(crate) fn block_sums(&self, session: &Session, req: block_sums::Repr) -> Message<'static> {
        let refuse = |status| proto::error_response(Opcode::BlockSums, status);
        if !matches!(
            session,
            Session::Open | Session::ProvenOperator | Session::ProvenDevice { .. }
        ) {
            self.metrics()
                .denied
                .with(&["not_operator_or_device"])
                .inc();
            return refuse(Status::AccessDenied);
        }
        let Some(region) = self.region(RegionIndex(req.region)) else {
            return refuse(Status::Unmapped);
        };
        let file = &region.file;
        match file
            .sums
            .current(&file.map, req.region, req.first, req.blocks)
        {
            Ok(report) => {
                self.metrics()
                    .summed_blocks
                    .with(&[region.entry.region_id.as_str()])
                    .add(report.sums.len() as u64);
                Message::BlockSumsReport(report)
            }
            Err(ScrubFault::OutOfRange { .. }) => refuse(Status::OutOfBounds),
            Err(e) => {
                tracing::error!(
                    region = region.entry.region_id.as_str(),
                    "block checksums failed: {}",
                    telemetry::logging::error_chain(&e)
                );
                refuse(Status::IoError)
            }
        }
    }
}
