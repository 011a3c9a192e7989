//! A token bucket of bytes: `rate` bytes per second, at most `burst` held.

use std::time::{Duration, Instant};

/// Bytes per second a resync copies when the device is not told otherwise.
pub(crate) const DEFAULT_RATE: u64 = 64 << 20;

/// Paces the bytes a resync copies.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    /// Bytes added per second (at least 1).
    rate: u64,
    /// The most bytes held.
    burst: u64,
    /// What the bucket holds at `at`, in billionths of a byte, so that
    /// refills are exact: a nanosecond adds `rate` of them.
    credit: u128,
    at: Instant,
}

const NANOS: u128 = 1_000_000_000;

impl TokenBucket {
    /// A full bucket of `burst` bytes refilled at `rate` bytes per second.
    /// A rate of 0 is taken as 1 byte per second, a burst of 0 as 1 byte.
    pub(crate) fn new(rate: u64, burst: u64, now: Instant) -> Self {
        let burst = burst.max(1);
        Self {
            rate: rate.max(1),
            burst,
            credit: u128::from(burst) * NANOS,
            at: now,
        }
    }

    /// Bytes per second.
    #[cfg(test)]
    pub(crate) fn rate(&self) -> u64 {
        self.rate
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        let full = u128::from(self.burst) * NANOS;
        self.credit = self
            .credit
            .saturating_add(elapsed.saturating_mul(u128::from(self.rate)))
            .min(full);
        self.at = self.at.max(now);
    }

    /// Takes `bytes` (at most the burst: more is taken as the burst) if the
    /// bucket holds them at `now`; otherwise takes nothing and says when it
    /// will.
    pub(crate) fn take(&mut self, bytes: u64, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        let wanted = u128::from(bytes.min(self.burst)) * NANOS;
        if self.credit >= wanted {
            self.credit -= wanted;
            return Ok(());
        }
        let nanos = (wanted - self.credit).div_ceil(u128::from(self.rate));
        let wait = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        Err(self.at + wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 64 << 10;

    #[test]
    fn a_full_bucket_gives_its_burst_then_paces_at_the_rate() {
        let start = Instant::now();
        // One block per 10 ms, two blocks of burst.
        let mut bucket = TokenBucket::new(100 * BLOCK, 2 * BLOCK, start);
        assert_eq!(bucket.take(BLOCK, start), Ok(()));
        assert_eq!(bucket.take(BLOCK, start), Ok(()));
        let later = bucket.take(BLOCK, start).expect_err("empty");
        assert_eq!(later, start + Duration::from_millis(10));
        // Asking early takes nothing and names the same time.
        let early = start + Duration::from_millis(4);
        assert_eq!(bucket.take(BLOCK, early), Err(later));
        assert_eq!(bucket.take(BLOCK, later), Ok(()));
    }

    #[test]
    fn copies_over_time_never_exceed_rate_times_time_plus_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(3 * BLOCK, BLOCK, start);
        let mut now = start;
        let mut copied = 0u64;
        while copied < 30 * BLOCK {
            match bucket.take(BLOCK, now) {
                Ok(()) => copied += BLOCK,
                Err(at) => {
                    assert!(at > now, "a retry time in the future");
                    now = at;
                }
            }
        }
        // 30 blocks at 3 blocks/s with a burst of one: 29 refills, 9⅔ s.
        let took = now - start;
        assert!(took >= Duration::from_nanos(9_666_666_666), "{took:?}");
        assert!(took <= Duration::from_nanos(9_666_666_700), "{took:?}");
    }

    #[test]
    fn the_bucket_holds_no_more_than_its_burst_and_no_zero_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(BLOCK, BLOCK, start);
        let idle = start + Duration::from_secs(3600);
        assert_eq!(bucket.take(BLOCK, idle), Ok(()));
        assert!(
            bucket.take(1, idle).is_err(),
            "an hour idle saved one burst"
        );
        // More than the burst is taken as the burst, so it is never stuck.
        assert_eq!(
            bucket.take(10 * BLOCK, idle + Duration::from_secs(1)),
            Ok(())
        );
        let default = TokenBucket::new(DEFAULT_RATE, BLOCK, start);
        assert_eq!(default.rate(), 64 << 20);
        let mut slow = TokenBucket::new(0, 0, start);
        assert_eq!(slow.rate(), 1);
        assert_eq!(slow.take(5, start), Ok(()));
        assert_eq!(slow.take(1, start), Err(start + Duration::from_secs(1)));
    }
}
