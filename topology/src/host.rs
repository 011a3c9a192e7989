//! The checks only a server's own host can make: that each PMEM device
//! `path` of the server exists there and is what pmem-server opens — a
//! directory (an fsdax mount holding region files) or a device DAX
//! character device (`/dev/daxX.Y`). `testbed validate --host SERVER` runs
//! them on the server's machine; pmem-server makes the same checks when it
//! opens its devices. The rest of validation holds on any machine and does
//! no I/O.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::ids::ServerId;
use crate::model::Topology;
use crate::validate::{Problem, ProblemKind};

/// What a path is, in words.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "neither a directory nor a character device"
    }
}

impl Topology {
    /// Checks, on this host, every PMEM device path of server `server`:
    /// each problem names the device and what to do. A server the
    /// topology does not have is one problem.
    pub fn check_host(&self, server: &ServerId) -> Vec<Problem> {
        let report = |item: String, kind| Problem {
            file: self.source.clone(),
            item,
            kind,
        };
        let Some(found) = self.server(server) else {
            let kind = ProblemKind::UnknownReference {
                kind: "server",
                id: server.to_string(),
            };
            return vec![report("--host".to_owned(), kind)];
        };
        let mut problems = Vec::new();
        for socket in &found.sockets {
            for device in &socket.devices {
                let Some(path) = &device.path else { continue };
                let item = format!(
                    "server {:?} socket {:?} PMEM device {:?}",
                    found.id.as_str(),
                    socket.id.as_str(),
                    device.id.as_str()
                );
                let kind = match std::fs::metadata(Path::new(path)) {
                    Err(e) => ProblemKind::DevicePathMissing {
                        path: path.clone(),
                        error: e.to_string(),
                    },
                    Ok(meta) if meta.is_dir() || meta.file_type().is_char_device() => continue,
                    Ok(meta) => ProblemKind::DevicePathWrongKind {
                        path: path.clone(),
                        found: kind_of(meta.file_type()),
                    },
                };
                problems.push(report(item, kind));
            }
        }
        problems
    }
}
