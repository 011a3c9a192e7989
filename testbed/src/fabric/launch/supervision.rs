//! What a supervisor needs of a running fabric: the daemons that exited
//! on their own, their logs, and the links after a restart.

use std::path::PathBuf;
use std::process::ExitStatus;

use super::{DaemonKind, Fabric, LaunchError};

/// A daemon process that has exited (and been reaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    /// Which daemon.
    pub kind: DaemonKind,
    /// Its id.
    pub id: String,
    /// The process id it had.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
}

impl Fabric {
    /// Reaps every daemon process that has exited, so none stays
    /// `<defunct>`, and lists them. A daemon stays listed (with the same
    /// pid) until it is restarted, so a caller tells new exits from ones it
    /// has seen by the pid.
    pub fn reap_exited(&mut self) -> Vec<Exited> {
        self.daemons
            .iter_mut()
            .filter_map(|((kind, id), daemon)| {
                let status = daemon.child.try_wait().ok().flatten()?;
                Some(Exited {
                    kind: *kind,
                    id: id.clone(),
                    pid: daemon.child.id(),
                    status,
                })
            })
            .collect()
    }

    /// A daemon's log file (its console copy for a server in a lab guest).
    pub fn log_file(&self, kind: DaemonKind, id: &str) -> Option<PathBuf> {
        self.daemons
            .get(&(kind, id.to_owned()))
            .map(|d| d.log.clone())
    }

    /// Waits until every fabric device reports every one of its links up
    /// (after a server restart the devices reconnect by themselves).
    pub fn await_all_links(&self) -> Result<(), LaunchError> {
        for id in self.daemon_ids(DaemonKind::FabricDevice) {
            self.await_links(&id)?;
        }
        Ok(())
    }
}
