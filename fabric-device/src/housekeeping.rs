//! When work the event loop used to do on every turn is due: after an
//! event that may have made some (a dirty mark), at a deadline the work
//! keeps for itself, and in any case once every [`FALLBACK`], so that an
//! event nobody marked delays the work by that much at most and never
//! loses it.

use std::time::{Duration, Instant};

/// Longest the gated work waits without a mark or a deadline: the first
/// turn this long after its last run runs it anyway.
pub const FALLBACK: Duration = Duration::from_millis(100);

/// The gate of one piece of periodic work.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gate {
    /// Something happened that may have given the work something to do.
    dirty: bool,
    /// When the work said it next has something to do without an event.
    next: Option<Instant>,
    /// When it last ran (`None`: never, so it is due).
    ran: Option<Instant>,
}

impl Gate {
    /// An event may have given the work something to do: it runs at the
    /// next turn.
    pub fn mark(&mut self) {
        self.dirty = true;
    }

    /// Whether the work is to run at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.dirty
            || self.next.is_some_and(|at| at <= now)
            || self
                .ran
                .is_none_or(|at| now.saturating_duration_since(at) >= FALLBACK)
    }

    /// The work ran at `now` and next has something to do, without an
    /// event, at `next` (`None`: only after an event).
    pub fn ran(&mut self, now: Instant, next: Option<Instant>) {
        self.dirty = false;
        self.next = next;
        self.ran = Some(now);
    }

    /// When the work next has something to do without an event, if it said.
    #[cfg(test)]
    pub fn next(&self) -> Option<Instant> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_at_first_after_a_mark_at_its_deadline_and_after_the_fallback() {
        let t0 = Instant::now();
        let mut gate = Gate::default();
        assert!(gate.due(t0), "never ran: due");
        gate.ran(t0, None);
        assert!(!gate.due(t0));
        assert!(!gate.due(t0 + FALLBACK - Duration::from_millis(1)));
        assert!(gate.due(t0 + FALLBACK), "the fallback runs it anyway");

        gate.ran(t0, Some(t0 + Duration::from_millis(5)));
        assert!(!gate.due(t0 + Duration::from_millis(4)));
        assert!(gate.due(t0 + Duration::from_millis(5)), "its deadline");
        assert_eq!(gate.next(), Some(t0 + Duration::from_millis(5)));

        gate.ran(t0, None);
        gate.mark();
        assert!(gate.due(t0), "a mark makes it due at once");
        gate.ran(t0, None);
        assert!(!gate.due(t0), "running clears the mark");
    }
}
