//! The process's own CPU time and resident memory, under their usual
//! Prometheus names, computed at each scrape.

use std::time::Duration;

use crate::{Registry, RegistryError};

/// Registers `process_cpu_seconds_total` (user + system CPU time of the
/// whole process, all threads) and `process_resident_memory_bytes`.
pub fn register_process_metrics(registry: &Registry) -> Result<(), RegistryError> {
    registry.register_fn_counter(
        "process_cpu_seconds_total",
        "User and system CPU time the process has used, in seconds.",
        &[],
        Box::new(|| cpu_seconds().map(|s| (vec![], s)).into_iter().collect()),
    )?;
    registry.register_fn_gauge(
        "process_resident_memory_bytes",
        "Resident memory of the process, in bytes.",
        &[],
        Box::new(|| {
            resident_bytes()
                .map(|b| (vec![], b as f64))
                .into_iter()
                .collect()
        }),
    )
}

/// User + system CPU time of this process, in seconds.
pub fn cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer we give, which
    // points at enough room for one.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so it filled the struct (and it started
    // zeroed, a valid rusage anyway).
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`, a
/// system call of a few hundred nanoseconds).
pub fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer we give,
    // which points at a valid one.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// This process's resident set (`VmRSS` of `/proc/self/status`), in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until this thread's CPU time grew by `work` (a bound on a hang
    /// only: 60 s of wall time); returns how much it grew.
    fn spin_for_cpu(work: Duration) -> Duration {
        let start = thread_cpu_time().expect("clock_gettime");
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        let mut x = 0u64;
        loop {
            let grew = thread_cpu_time().expect("clock_gettime") - start;
            if grew >= work || std::time::Instant::now() > give_up {
                return grew;
            }
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }

    #[test]
    fn a_threads_cpu_time_counts_its_work_not_its_sleep() {
        let start = thread_cpu_time().expect("clock_gettime");
        std::thread::sleep(Duration::from_millis(50));
        let slept = thread_cpu_time().expect("clock_gettime") - start;
        let worked = spin_for_cpu(Duration::from_millis(20));
        assert!(worked >= Duration::from_millis(20), "worked {worked:?}");
        // Sleeping costs a thread next to nothing; another thread's work
        // is not its own.
        assert!(slept < worked, "slept {slept:?}, worked {worked:?}");
        let before = thread_cpu_time().expect("clock_gettime");
        let other = std::thread::spawn(|| spin_for_cpu(Duration::from_millis(20)));
        let theirs = other.join().expect("the spinning thread");
        let mine = thread_cpu_time().expect("clock_gettime") - before;
        assert!(mine < theirs, "mine {mine:?} while it spun {theirs:?}");
    }

    #[test]
    fn cpu_time_grows_with_work_and_both_series_render() {
        let before = cpu_seconds().expect("getrusage");
        spin_for_cpu(Duration::from_millis(20));
        assert!(cpu_seconds().expect("getrusage") > before);
        let registry = Registry::new();
        register_process_metrics(&registry).expect("register");
        let text = registry.render();
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }
}
