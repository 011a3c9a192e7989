//! When a worker's workload ends: at its deadline, or, held open, once
//! both the deadline has passed and its standard input has closed (the
//! run closes it after its last fault: a fault that waits for the map,
//! such as a kill that waits for every copy to serve again, may come
//! later than planned, and the application must still be running then).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The end of a workload, shared by its tasks.
#[derive(Debug, Clone)]
pub struct End {
    deadline: Instant,
    /// Set while the standard input is open (held open only).
    held: Option<Arc<AtomicBool>>,
}

impl End {
    /// Ends at `deadline`.
    pub fn at(deadline: Instant) -> Self {
        Self {
            deadline,
            held: None,
        }
    }

    /// Ends at `deadline`, or later if the standard input is still open
    /// then: a thread reads it to its end.
    pub fn held_open(deadline: Instant) -> Self {
        let held = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&held);
        let spawned = std::thread::Builder::new()
            .name("held-open".into())
            .spawn(move || {
                let mut sink = [0u8; 256];
                let mut stdin = std::io::stdin().lock();
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                flag.store(false, Ordering::Relaxed);
            });
        if spawned.is_err() {
            held.store(false, Ordering::Relaxed);
        }
        Self {
            deadline,
            held: Some(held),
        }
    }

    /// Whether the workload is over now.
    pub fn reached(&self) -> bool {
        Instant::now() >= self.deadline
            && !self
                .held
                .as_ref()
                .is_some_and(|open| open.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_workload_ends_at_its_deadline_unless_held_open() {
        let past = Instant::now() - Duration::from_millis(1);
        assert!(End::at(past).reached());
        let future = Instant::now() + Duration::from_secs(3600);
        assert!(!End::at(future).reached());
        let open = Arc::new(AtomicBool::new(true));
        let held = End {
            deadline: past,
            held: Some(Arc::clone(&open)),
        };
        assert!(!held.reached());
        open.store(false, Ordering::Relaxed);
        assert!(held.reached());
    }
}
