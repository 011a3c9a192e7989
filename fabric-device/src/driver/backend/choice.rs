//! Which I/O back end the device runs, decided once at start.
//!
//! epoll is the default: on loopback TCP it forwarded more operations per
//! second for less CPU than the io_uring back end (`docs/benchmarks.md`).
//! io_uring runs when asked for and the kernel allows it: the ring must be
//! set up (`io_uring_setup` may be refused, or disabled by the sysctl
//! `kernel.io_uring_disabled`), and the kernel must be 6.0 or newer for
//! multishot receive into a provided-buffer ring. Otherwise the device
//! falls back to epoll and says why.

use std::fmt;
use std::str::FromStr;

/// An event-loop back end for the TCP ports and server links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Completions on one io_uring (multishot accept and receive, batched sends).
    Uring,
    /// Readiness with epoll, reads and writes by system call.
    Epoll,
}

impl Backend {
    /// The name used on the command line, in logs and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Uring => "io_uring",
            Backend::Epoll => "epoll",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown back-end name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown I/O back end {0:?}: use `uring` (io_uring) or `epoll`")]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "uring" | "io_uring" | "io-uring" => Ok(Backend::Uring),
            "epoll" => Ok(Backend::Epoll),
            _ => Err(UnknownBackend(s.to_owned())),
        }
    }
}

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoConfig {
    /// The back end wanted; io_uring falls back to epoll where the kernel
    /// does not allow it.
    pub backend: Backend,
    /// With io_uring: a kernel thread polls the submission queue, so
    /// submitting takes no system call (for a device with a core of its own).
    pub sqpoll: bool,
}

impl Default for IoConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Epoll,
            sqpoll: false,
        }
    }
}

/// Why io_uring was asked for and epoll runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// A short label for the metric: `sysctl`, `old_kernel`,
    /// `setup_refused` or `setup_failed`.
    pub label: &'static str,
    /// The reason in words, for the log.
    pub why: String,
}

/// The back end that runs, and why it is not the one asked for, if so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The back end in use.
    pub backend: Backend,
    /// Why io_uring was asked for and epoll runs.
    pub fallback: Option<Fallback>,
}

impl Selected {
    /// The one log line said at start.
    pub fn log_line(&self, sqpoll: bool) -> String {
        match (&self.fallback, self.backend) {
            (Some(Fallback { why, .. }), _) => format!(
                "I/O back end: epoll (io_uring was asked for and cannot run: {why}; \
                 `--io epoll` says so without this line)"
            ),
            (None, Backend::Uring) if sqpoll => {
                "I/O back end: io_uring, with a submission-queue polling thread".to_owned()
            }
            (None, backend) => format!("I/O back end: {backend}"),
        }
    }
}

/// The lowest kernel with multishot receive (6.0).
const MIN_KERNEL: (u32, u32) = (6, 0);

/// Why this kernel cannot run the io_uring back end, from its release
/// string (`uname -r`) and `kernel.io_uring_disabled` (absent: `None`);
/// `None` when nothing known stops it (setting the ring up may still fail).
pub fn kernel_refusal(release: &str, disabled: Option<&str>) -> Option<Fallback> {
    if let Some(value) = disabled.map(str::trim)
        && value == "2"
    {
        return Some(Fallback {
            label: "sysctl",
            why: "disabled by sysctl kernel.io_uring_disabled=2".to_owned(),
        });
    }
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) < MIN_KERNEL => Some(Fallback {
            label: "old_kernel",
            why: format!(
                "kernel {release} is older than {}.{} (multishot receive)",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        }),
        _ => None,
    }
}

/// Why setting the ring up failed, in words, given the sysctl's value.
pub fn setup_refusal(error: &std::io::Error, disabled: Option<&str>) -> Fallback {
    let sysctl = disabled.map(str::trim).unwrap_or("absent");
    let (label, why) = match error.raw_os_error() {
        Some(libc::ENOSYS) => (
            "setup_refused",
            "the kernel has no io_uring (io_uring_setup: ENOSYS)".to_owned(),
        ),
        Some(libc::EPERM) => (
            "setup_refused",
            format!(
                "io_uring_setup refused (EPERM; sysctl kernel.io_uring_disabled={sysctl}, \
                 or a seccomp filter)"
            ),
        ),
        _ => (
            "setup_failed",
            format!("setting up the ring failed: {error}"),
        ),
    };
    Fallback { label, why }
}

/// The kernel's release string and `kernel.io_uring_disabled`, as read now.
pub fn read_kernel_facts() -> (String, Option<String>) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
    (release, disabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_both_ways() {
        for name in ["uring", "io_uring", "IO-URING", " uring "] {
            assert_eq!(name.parse(), Ok(Backend::Uring), "{name}");
        }
        assert_eq!("epoll".parse(), Ok(Backend::Epoll));
        assert!("kqueue".parse::<Backend>().is_err());
        assert_eq!(Backend::Uring.as_str().parse(), Ok(Backend::Uring));
    }

    #[test]
    fn a_disabled_sysctl_or_an_old_kernel_refuses() {
        assert_eq!(kernel_refusal("6.18.44-fc", Some("0\n")), None);
        assert_eq!(kernel_refusal("6.18.44-fc", Some("1\n")), None);
        assert_eq!(kernel_refusal("6.0.0", None), None);
        let why = kernel_refusal("6.18.44", Some("2\n")).expect("disabled");
        assert_eq!(why.label, "sysctl");
        assert!(why.why.contains("kernel.io_uring_disabled=2"), "{why:?}");
        let why = kernel_refusal("5.15.0-91-generic", None).expect("old").why;
        assert!(
            why.contains("5.15.0-91-generic") && why.contains("6.0"),
            "{why}"
        );
        // An unreadable release does not stop it: setting up the ring decides.
        assert_eq!(kernel_refusal("", None), None);
    }

    #[test]
    fn setup_errors_say_what_refused() {
        let eperm = std::io::Error::from_raw_os_error(libc::EPERM);
        let why = setup_refusal(&eperm, Some("1\n"));
        assert_eq!(why.label, "setup_refused");
        assert!(
            why.why.contains("EPERM") && why.why.contains("=1"),
            "{why:?}"
        );
        let enosys = std::io::Error::from_raw_os_error(libc::ENOSYS);
        assert!(setup_refusal(&enosys, None).why.contains("no io_uring"));
    }

    #[test]
    fn the_log_line_names_the_back_end_and_the_reason() {
        let fell = Selected {
            backend: Backend::Epoll,
            fallback: kernel_refusal("6.1", Some("2")),
        };
        let line = fell.log_line(false);
        assert!(line.starts_with("I/O back end: epoll"), "{line}");
        assert!(line.contains("io_uring_disabled=2"), "{line}");
        let ring = Selected {
            backend: Backend::Uring,
            fallback: None,
        };
        assert_eq!(ring.log_line(false), "I/O back end: io_uring");
        assert!(ring.log_line(true).contains("polling thread"));
    }
}
