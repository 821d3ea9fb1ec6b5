//! The clock behind validity deadlines.
//!
//! A lease is counted by the Redis server in wall time, including any time this machine spends
//! suspended. `std::time::Instant` uses `CLOCK_MONOTONIC` on Linux, which stops during suspend, so
//! a laptop or VM waking up would believe a long-expired lease is still valid. Deadlines are
//! therefore measured on `CLOCK_BOOTTIME` where the platform has it.

use std::time::Duration;

/// A point in time on a clock that keeps counting while the machine is suspended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BootInstant(Duration);

impl BootInstant {
    /// The current time.
    pub(crate) fn now() -> Self {
        Self(now_since_boot())
    }

    /// Nanoseconds since boot, for storing in an atomic.
    pub(crate) fn as_nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Time passed since `earlier`, zero if it is not earlier.
    pub(crate) fn duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time left until `self`, zero if it has passed.
    pub(crate) fn saturating_duration_until(self, now: Self) -> Duration {
        self.0.saturating_sub(now.0)
    }
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = Self;

    fn add(self, rhs: Duration) -> Self {
        Self(self.0 + rhs)
    }
}

impl std::ops::Sub<Duration> for BootInstant {
    type Output = Self;

    fn sub(self, rhs: Duration) -> Self {
        Self(self.0.saturating_sub(rhs))
    }
}

#[cfg(target_os = "linux")]
fn now_since_boot() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn now_since_boot() -> Duration {
    // Elsewhere the monotonic clock is the best portable choice; see the module docs.
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boot clock moves forward with the monotonic clock.
    #[test]
    fn boot_clock_advances() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = BootInstant::now();
        assert!(b > a);
        assert!((a + Duration::from_millis(5)) <= b);
        assert_eq!(a.saturating_duration_until(b), Duration::ZERO);
        assert!(b.saturating_duration_until(a) >= Duration::from_millis(5));
        assert_eq!(b.duration_since(a), b.saturating_duration_until(a));
        assert_eq!(a.duration_since(b), Duration::ZERO);
    }
}
