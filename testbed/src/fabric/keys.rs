//! Keys for a fabric's principals: one fresh random key file per client
//! and fabric device of a topology, and one for the operator
//! [`OPERATOR`] (see `topology::secrets`).

use std::path::{Path, PathBuf};

use topology::Topology;
use topology::secrets::{KEY_LEN, Principal, SecretError, write_key};

/// The operator `keygen` makes a key for (`pmemctl rotate-key` acts as
/// it by default).
pub const OPERATOR: &str = "admin";

/// Writes a fresh key for every client and fabric device of `topology`,
/// and for the operator [`OPERATOR`], into `dir`, readable by the owner
/// only; returns the files written.
pub fn generate(topology: &Topology, dir: &Path) -> Result<Vec<PathBuf>, SecretError> {
    let principals = topology
        .clients
        .iter()
        .map(|c| Principal::Client(c.id.as_str()))
        .chain(
            topology
                .fabric_devices
                .iter()
                .map(|d| Principal::Device(d.id.as_str())),
        )
        .chain([Principal::Operator(OPERATOR)]);
    principals
        .map(|principal| {
            let mut key = [0u8; KEY_LEN];
            getrandom::fill(&mut key).map_err(|e| SecretError::Io {
                path: dir.join(principal.file_name()),
                source: std::io::Error::other(e.to_string()),
            })?;
            write_key(dir, principal, &key)
        })
        .collect()
}
