//! How a daemon's exit is told: the signal by name or the exit status.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// `killed by signal 9 (SIGKILL)`, `exited with status 1`, `exited
/// normally (status 0)`; a core dump is mentioned.
pub fn describe(status: ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        return match signal_name(signal) {
            Some(name) => format!("killed by signal {signal} ({name}){core}"),
            None => format!("killed by signal {signal}{core}"),
        };
    }
    match status.code() {
        Some(0) => "exited normally (status 0)".to_owned(),
        Some(code) => format!("exited with status {code}"),
        None => format!("ended ({status})"),
    }
}

/// The usual name of a signal a daemon may die of.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_and_statuses_are_named() {
        // Raw wait statuses: the low 7 bits are the signal, bit 7 a core
        // dump, the next byte an exit code.
        assert_eq!(
            describe(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(11 | 0x80)),
            "killed by signal 11 (SIGSEGV), core dumped"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(1 << 8)),
            "exited with status 1"
        );
        assert_eq!(
            describe(ExitStatus::from_raw(0)),
            "exited normally (status 0)"
        );
        assert_eq!(describe(ExitStatus::from_raw(60)), "killed by signal 60");
    }
}
