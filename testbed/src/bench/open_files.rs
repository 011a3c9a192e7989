//! The open-file limit (`RLIMIT_NOFILE`) the bench needs for its idle
//! client connections: each one is a socket in the bench's process and
//! another in the fabric device's. The daemons the bench starts inherit
//! the bench's limit, so raising it here, before they start, raises theirs.

use std::io;

/// Descriptors kept for everything but the idle connections: the daemons'
/// links, listeners, log pipes and files, the bench's other connections.
pub const HEADROOM: u64 = 1024;

/// An `RLIMIT_NOFILE` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// What the process may open now.
    pub soft: u64,
    /// How far an unprivileged process may raise `soft`.
    pub hard: u64,
}

/// What to set so that `needed` descriptors fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The limit already allows it.
    None,
    /// Set this limit (only the soft one grows when the hard one allows).
    Set(Limit),
}

/// The change that lets a process with limit `now` open `needed`
/// descriptors: the soft limit up to `needed`, and the hard one too when
/// it is lower (which only a privileged process may do).
pub fn change_for(now: Limit, needed: u64) -> Change {
    if now.soft >= needed {
        return Change::None;
    }
    Change::Set(Limit {
        soft: needed,
        hard: now.hard.max(needed),
    })
}

/// Why the limit could not be raised.
#[derive(Debug, thiserror::Error)]
pub enum OpenFilesError {
    /// getrlimit failed.
    #[error("cannot read the open-file limit (RLIMIT_NOFILE)")]
    Read(#[source] io::Error),
    /// setrlimit refused the new limit.
    #[error(
        "{connections} idle client connections need {needed} open files in the bench and in \
         its fabric device, but the open-file limit (RLIMIT_NOFILE) is {soft} (hard {hard}) \
         and could not be raised to {needed}: run the bench as root, raise the hard limit \
         first (`ulimit -Hn {needed}` as root, or `nofile` in /etc/security/limits.conf; \
         the kernel's ceiling is /proc/sys/fs/nr_open), or ask for fewer with \
         --idle-connections"
    )]
    Raise {
        /// Idle connections asked for.
        connections: usize,
        /// Descriptors they need with the headroom.
        needed: u64,
        /// The soft limit before.
        soft: u64,
        /// The hard limit before.
        hard: u64,
        /// What setrlimit said.
        #[source]
        source: io::Error,
    },
}

/// The open-file limit of this process.
pub fn current() -> Result<Limit, OpenFilesError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 {
        return Err(OpenFilesError::Read(io::Error::last_os_error()));
    }
    Ok(Limit {
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// Raises this process's open-file limit so that `connections` idle
/// connections fit with [`HEADROOM`] to spare (before the daemons start,
/// so that they inherit it); returns the limit in force afterwards.
pub fn allow_connections(connections: usize) -> Result<Limit, OpenFilesError> {
    let needed = connections as u64 + HEADROOM;
    let now = current()?;
    let Change::Set(new) = change_for(now, needed) else {
        return Ok(now);
    };
    let limit = libc::rlimit {
        rlim_cur: new.soft,
        rlim_max: new.hard,
    };
    // SAFETY: `limit` is a valid rlimit; setrlimit only reads it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    if rc != 0 {
        return Err(OpenFilesError::Raise {
            connections,
            needed,
            soft: now.soft,
            hard: now.hard,
            source: io::Error::last_os_error(),
        });
    }
    current()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_that_fits_is_left_alone() {
        let now = Limit {
            soft: 20_000,
            hard: 20_000,
        };
        assert_eq!(change_for(now, 11_024), Change::None);
        assert_eq!(change_for(now, 20_000), Change::None);
    }

    #[test]
    fn the_soft_limit_grows_to_the_need_under_the_hard_one() {
        let now = Limit {
            soft: 1024,
            hard: 1 << 20,
        };
        assert_eq!(
            change_for(now, 11_024),
            Change::Set(Limit {
                soft: 11_024,
                hard: 1 << 20
            })
        );
    }

    #[test]
    fn the_hard_limit_grows_too_when_it_is_lower() {
        let now = Limit {
            soft: 1024,
            hard: 4096,
        };
        assert_eq!(
            change_for(now, 11_024),
            Change::Set(Limit {
                soft: 11_024,
                hard: 11_024
            })
        );
    }

    #[test]
    fn raising_to_what_is_already_allowed_changes_nothing() {
        let before = current().expect("getrlimit");
        if before.soft < HEADROOM {
            return;
        }
        let connections = before.soft.saturating_sub(HEADROOM) as usize;
        assert_eq!(allow_connections(connections).expect("no change"), before);
    }

    #[test]
    fn the_refusal_names_the_limits_and_what_to_do() {
        let err = OpenFilesError::Raise {
            connections: 10_000,
            needed: 11_024,
            soft: 1024,
            hard: 4096,
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = err.to_string();
        for part in [
            "10000 idle client connections",
            "need 11024 open files",
            "is 1024 (hard 4096)",
            "ulimit -Hn 11024",
            "--idle-connections",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }
}
