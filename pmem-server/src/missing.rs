//! Regions absent at start: which of them may be created empty.
//!
//! Before any region is opened, the server looks at all of its regions
//! together. A region whose file (or device DAX header) is absent is
//! created empty only when nothing says it held data:
//!
//! - none of the server's regions is present, the manifest lists none of
//!   them and there is no exactly-once window file: a brand-new data
//!   directory, every region is created;
//! - the manifest exists and does not list it: a region new to this
//!   server's topology.
//!
//! Otherwise the region is lost: the manifest lists it, or other regions
//! of the server (or its window file) are present while the manifest is
//! gone too. The server
//! then refuses to start and names every lost region, unless the operator
//! names it with `--create-missing REGION` or starts over with `--format`.

use std::fmt::Write as _;
use std::path::PathBuf;

use topology::{LayoutEntry, ServerId};

use crate::devices::ServerDevices;
use crate::persist::PersistPolicy;
use crate::region_file::{Manifest, OpenMode, RegionFile, RegionFileError};

/// Why the regions cannot be opened as they are.
#[derive(Debug, thiserror::Error)]
pub enum MissingError {
    /// `--create-missing` names a region the server does not have.
    #[error("--create-missing {region}: server {server} has no region {region:?} (it has: {has})")]
    UnknownRegion {
        /// The region named.
        region: String,
        /// The server.
        server: ServerId,
        /// The server's regions, comma-separated.
        has: String,
    },
    /// Regions the data directory held are gone.
    #[error(
        "{}; their data is gone unless restored. Restore them, start with {} to create just \
         those regions empty, or with --format to recreate every region empty",
        describe_lost(.lost, .held, .manifest, .window),
        create_flags(.lost)
    )]
    Lost {
        /// Each lost region and where it should be.
        lost: Vec<(String, PathBuf)>,
        /// The regions of the server that are present.
        held: Vec<String>,
        /// The manifest, when it lists a lost region.
        manifest: Option<PathBuf>,
        /// The exactly-once window file, when it shows the data directory
        /// was in use.
        window: Option<PathBuf>,
    },
    /// Looking for a region failed.
    #[error(transparent)]
    Region(#[from] RegionFileError),
}

fn describe_lost(
    lost: &[(String, PathBuf)],
    held: &[String],
    manifest: &Option<PathBuf>,
    window: &Option<PathBuf>,
) -> String {
    let mut text = String::new();
    for (i, (id, at)) in lost.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(text, "{sep}region {id} ({})", at.display());
    }
    text.push_str(if lost.len() == 1 {
        " is missing"
    } else {
        " are missing"
    });
    match (manifest, held.is_empty(), window) {
        (Some(manifest), _, _) => {
            let _ = write!(
                text,
                ", but {} says this server held it",
                manifest.display()
            );
        }
        (None, false, _) => {
            let _ = write!(
                text,
                " (and so is the manifest) while the server still holds {}",
                held.join(", ")
            );
        }
        (None, true, Some(window)) => {
            let _ = write!(
                text,
                " (and so is the manifest) while {} shows the data directory was in use",
                window.display()
            );
        }
        (None, true, None) => {}
    }
    text
}

fn create_flags(lost: &[(String, PathBuf)]) -> String {
    lost.iter()
        .map(|(id, _)| format!("--create-missing {id}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How to open each region of the server: the [`OpenMode`] for `entries`
/// (the server's regions) given `--format` and the regions named by
/// `--create-missing`, or why the server must not start.
pub fn open_modes(
    server: &ServerId,
    plan: &ServerDevices,
    entries: &[&LayoutEntry],
    policy: &PersistPolicy,
    format: bool,
    create_missing: &[String],
) -> Result<Vec<OpenMode>, MissingError> {
    for region in create_missing {
        if !entries.iter().any(|e| e.region_id.as_str() == region) {
            return Err(MissingError::UnknownRegion {
                region: region.clone(),
                server: server.clone(),
                has: entries
                    .iter()
                    .map(|e| e.region_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    if format {
        return Ok(vec![OpenMode::Format; entries.len()]);
    }
    let manifest = Manifest::read(&plan.data_dir)?;
    let mut absent = Vec::new();
    let mut held = Vec::new();
    for entry in entries {
        let id = entry.region_id.as_str();
        match RegionFile::absent_at(plan, entry, policy)? {
            Some(at) => absent.push((id.to_owned(), at)),
            None => held.push(id.to_owned()),
        }
    }
    let window = plan.data_dir.join(crate::dedup::FILE_NAME);
    let window = window
        .try_exists()
        .map_err(|source| RegionFileError::Io {
            path: window.clone(),
            op: "check for",
            source,
        })?
        .then_some(window);
    let new_directory =
        held.is_empty() && window.is_none() && !absent.iter().any(|(id, _)| manifest.lists(id));
    let lost: Vec<(String, PathBuf)> = absent
        .into_iter()
        .filter(|(id, _)| {
            let new_region = !manifest.is_empty() && !manifest.lists(id);
            !new_directory && !new_region && !create_missing.contains(id)
        })
        .collect();
    if !lost.is_empty() {
        let listed = lost.iter().any(|(id, _)| manifest.lists(id));
        return Err(MissingError::Lost {
            lost,
            held,
            manifest: listed.then(|| manifest.path.clone()),
            window,
        });
    }
    Ok(entries
        .iter()
        .map(|e| {
            if create_missing.iter().any(|r| r == e.region_id.as_str()) {
                OpenMode::CreateMissing
            } else {
                OpenMode::Keep
            }
        })
        .collect())
}
