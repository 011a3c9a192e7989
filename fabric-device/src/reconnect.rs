//! When each server link is (re)connected, sans-IO: exponential backoff
//! between failed attempts, a limit on how long a connect may take, and a
//! fresh start after a link that was up breaks. The driver owns the sockets
//! and asks this schedule which links to connect and when to wake up;
//! nothing here reads a clock, so the schedule is tested on virtual time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::ids::LinkId;

/// How reconnecting behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// The first delay after a failure; doubles per failure up to `max`.
    pub min: Duration,
    /// The longest delay between attempts.
    pub max: Duration,
    /// A connect not done after this long has failed.
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The next attempt is due at `at`; after it fails, wait `next`.
    Waiting { at: Instant, next: Duration },
    /// An attempt started at `since`; after it fails, wait `next`.
    Connecting { since: Instant, next: Duration },
    /// Connected.
    Connected,
}

/// The reconnect schedule of every link.
#[derive(Debug)]
pub struct Reconnects {
    policy: ReconnectPolicy,
    links: HashMap<LinkId, State>,
}

impl Reconnects {
    /// An empty schedule.
    pub fn new(policy: ReconnectPolicy) -> Self {
        Self {
            policy,
            links: HashMap::new(),
        }
    }

    /// A link to connect, due at once.
    pub fn add(&mut self, link: LinkId, now: Instant) {
        self.links.insert(
            link,
            State::Waiting {
                at: now,
                next: self.policy.min,
            },
        );
    }

    /// A link no longer in the topology.
    pub fn remove(&mut self, link: LinkId) {
        self.links.remove(&link);
    }

    /// Links whose next attempt is due at `now`.
    pub fn due(&self, now: Instant) -> Vec<LinkId> {
        self.links
            .iter()
            .filter(|(_, s)| matches!(s, State::Waiting { at, .. } if *at <= now))
            .map(|(link, _)| *link)
            .collect()
    }

    /// Links whose connect has taken longer than the connect timeout: the
    /// driver fails them ([`failed`](Self::failed)).
    pub fn timed_out(&self, now: Instant) -> Vec<LinkId> {
        let limit = self.policy.connect_timeout;
        self.links
            .iter()
            .filter(|(_, s)| matches!(s, State::Connecting { since, .. } if now >= *since + limit))
            .map(|(link, _)| *link)
            .collect()
    }

    /// An attempt on `link` started at `now`.
    pub fn connecting(&mut self, link: LinkId, now: Instant) {
        if let Some(state) = self.links.get_mut(&link) {
            let next = match *state {
                State::Waiting { next, .. } | State::Connecting { next, .. } => next,
                State::Connected => self.policy.min,
            };
            *state = State::Connecting { since: now, next };
        }
    }

    /// `link`'s connect completed.
    pub fn connected(&mut self, link: LinkId) {
        if let Some(state) = self.links.get_mut(&link) {
            *state = State::Connected;
        }
    }

    /// `link` failed at `now` (a connect that did not complete, or a link
    /// that broke): the next attempt waits. A link that was up starts over
    /// from the shortest delay; repeated failures double it, up to the
    /// longest.
    pub fn failed(&mut self, link: LinkId, now: Instant) {
        let Some(state) = self.links.get_mut(&link) else {
            return;
        };
        let wait = match *state {
            State::Connected => self.policy.min,
            State::Waiting { next, .. } | State::Connecting { next, .. } => next,
        };
        *state = State::Waiting {
            at: now + wait,
            next: (wait * 2).min(self.policy.max),
        };
    }

    /// When the schedule next needs the driver: an attempt due, or a
    /// connect timing out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.links
            .values()
            .filter_map(|s| match s {
                State::Waiting { at, .. } => Some(*at),
                State::Connecting { since, .. } => Some(*since + self.policy.connect_timeout),
                State::Connected => None,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn schedule() -> (Reconnects, Instant) {
        let backoff = ReconnectPolicy {
            min: 20 * MS,
            max: 200 * MS,
            connect_timeout: 2000 * MS,
        };
        (Reconnects::new(backoff), Instant::now())
    }

    #[test]
    fn failures_double_the_wait_up_to_the_longest() {
        let (mut r, t0) = schedule();
        let link = LinkId(1);
        r.add(link, t0);
        assert_eq!(r.due(t0), vec![link], "a new link is due at once");
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            r.connecting(link, now);
            assert!(r.due(now).is_empty(), "not due while connecting");
            r.failed(link, now);
            let at = r.poll_timeout().expect("an attempt is scheduled");
            waits.push((at - now).as_millis());
            assert!(r.due(at - MS).is_empty());
            assert_eq!(r.due(at), vec![link]);
            now = at;
        }
        assert_eq!(waits, [20, 40, 80, 160, 200, 200]);
    }

    #[test]
    fn a_link_that_was_up_starts_over_from_the_shortest_wait() {
        let (mut r, t0) = schedule();
        let link = LinkId(7);
        r.add(link, t0);
        for _ in 0..4 {
            r.connecting(link, t0);
            r.failed(link, t0);
        }
        r.connecting(link, t0);
        r.connected(link);
        assert_eq!(r.poll_timeout(), None, "nothing to do while up");
        let broke = t0 + 5000 * MS;
        r.failed(link, broke);
        assert_eq!(r.poll_timeout(), Some(broke + 20 * MS));
    }

    #[test]
    fn a_connect_that_takes_too_long_times_out() {
        let (mut r, t0) = schedule();
        let link = LinkId(3);
        r.add(link, t0);
        r.connecting(link, t0);
        assert_eq!(r.poll_timeout(), Some(t0 + 2000 * MS));
        assert!(r.timed_out(t0 + 1999 * MS).is_empty());
        assert_eq!(r.timed_out(t0 + 2000 * MS), vec![link]);
        r.failed(link, t0 + 2000 * MS);
        assert_eq!(r.poll_timeout(), Some(t0 + 2020 * MS));
        r.remove(link);
        assert_eq!(r.poll_timeout(), None);
    }
}
