//! Advice that fits the testbed command that failed, where a daemon's own
//! message names options of the daemon rather than of the testbed.

use std::path::Path;

use crate::fabric::launch::{DaemonKind, LaunchError};

/// Which testbed command brought the fabric up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter {
    /// `testbed up`, which has `--format`.
    Up,
    /// `testbed run`, `chaos` or `demo`, which have no `--format`.
    Run,
}

/// What to do when a fabric did not start because a pmem-server refused
/// the region files in `data_dir` (its log says `--format` or
/// `--create-missing`, options of the pmem-server), in the words of the
/// command that started it; `None` for other failures.
pub fn start_failure(err: &LaunchError, starter: Starter, data_dir: &Path) -> Option<String> {
    let LaunchError::NotReady {
        kind: DaemonKind::PmemServer,
        id,
        why,
        ..
    } = err
    else {
        return None;
    };
    if !(why.contains("--format") || why.contains("--create-missing")) {
        return None;
    }
    let dir = data_dir.join(id);
    Some(match starter {
        Starter::Up => format!(
            "server {id}'s region files in {} do not fit this topology: `testbed up --format` \
             recreates every server's regions empty (their data is lost), or give `up` another \
             --data-dir",
            dir.display()
        ),
        Starter::Run => format!(
            "server {id}'s region files in {} do not fit this topology: give the run another \
             --data-dir (or none: a fresh one in the report folder), or remove {} to start it \
             empty",
            dir.display(),
            data_dir.display()
        ),
    })
}

/// `err` as the error of bringing the fabric up, followed by
/// [`start_failure`]'s advice on a line of its own when there is some.
pub fn start_error(err: LaunchError, starter: Starter, data_dir: &Path) -> anyhow::Error {
    let advice = start_failure(&err, starter, data_dir);
    let err = anyhow::Error::new(err).context("bring the fabric up");
    match advice {
        Some(advice) => anyhow::anyhow!("{err:#}\n  what to do: {advice}"),
        None => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(kind: DaemonKind, why: &str) -> LaunchError {
        LaunchError::NotReady {
            kind,
            id: "B".to_owned(),
            why: why.to_owned(),
            log: "logs/pmem-server-B.log".to_owned(),
        }
    }

    #[test]
    fn region_refusals_get_the_starters_own_options() {
        let err = refused(
            DaemonKind::PmemServer,
            "exited with exit status: 1; last log lines:\nB1.pmem: bad magic; use --format to recreate it",
        );
        let up = start_failure(&err, Starter::Up, Path::new("data")).expect("advice");
        assert!(up.contains("testbed up --format"), "{up}");
        assert!(up.contains("data/B"), "{up}");
        let run = start_failure(&err, Starter::Run, Path::new("data")).expect("advice");
        assert!(!run.contains("--format"), "run has no --format: {run}");
        assert!(run.contains("--data-dir"), "{run}");
    }

    #[test]
    fn other_failures_get_none() {
        let timeout = refused(DaemonKind::PmemServer, "no ready line within 30s");
        assert_eq!(start_failure(&timeout, Starter::Up, Path::new("d")), None);
        let device = refused(DaemonKind::FabricDevice, "use --format");
        assert_eq!(start_failure(&device, Starter::Up, Path::new("d")), None);
    }
}
