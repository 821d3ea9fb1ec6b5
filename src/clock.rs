//! The clock behind validity deadlines.
//!
//! A lease is counted by the Redis server in wall time, including any time this machine spends
//! suspended. `std::time::Instant` uses `CLOCK_MONOTONIC` on Linux, which stops during suspend, so
//! a laptop or VM waking up would believe a long-expired lease is still valid. Deadlines are
//! therefore measured on `CLOCK_BOOTTIME` where the platform has it: the monotonic clock plus
//! the time spent suspended: one clock read.
//!
//! With the `test-util` feature (and in the crate's own unit tests) the monotonic part is read
//! through tokio instead, so that under a paused test clock (`tokio::time::pause`) the
//! engine's deadlines, its watchdog's timers and the in-memory backend's leases all move
//! together. That costs two more clock reads per reading, which a request path makes several
//! of, so it is not the default.

use std::time::Duration;

/// A point in time on a clock that keeps counting while the machine is suspended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BootInstant(Duration);

impl BootInstant {
    /// The current time.
    pub(crate) fn now() -> Self {
        Self(now_since_boot())
    }

    /// The time `nanos` nanoseconds after boot, as [`as_nanos`](Self::as_nanos) stored it.
    pub(crate) fn from_nanos(nanos: u64) -> Self {
        Self(Duration::from_nanos(nanos))
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

    /// Saturates: a duration the caller gave (a wait, a lease) never overflows the clock.
    fn add(self, rhs: Duration) -> Self {
        Self(self.0.saturating_add(rhs))
    }
}

/// A wait this long or longer has no end: about 30 years, which any clock reading can have
/// added to it. `Duration::MAX` waits without limit.
pub(crate) const UNLIMITED: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `at` plus a duration a caller gave (a wait, a lease, a waiter's timeout): one of
/// [`UNLIMITED`] or more ends in the far future instead of overflowing.
pub(crate) fn after(at: tokio::time::Instant, duration: Duration) -> tokio::time::Instant {
    at + duration.min(UNLIMITED)
}

impl std::ops::Sub<Duration> for BootInstant {
    type Output = Self;

    fn sub(self, rhs: Duration) -> Self {
        Self(self.0.saturating_sub(rhs))
    }
}

/// The monotonic clock as tokio reads it: the system's monotonic clock, except under a paused
/// test clock (`tokio::time::pause`), which deadlines then follow as timers do.
#[cfg(any(test, feature = "test-util", not(target_os = "linux")))]
fn monotonic_now() -> Duration {
    static ANCHOR: std::sync::OnceLock<(tokio::time::Instant, Duration)> =
        std::sync::OnceLock::new();
    let (at, since_start_at) =
        *ANCHOR.get_or_init(|| (tokio::time::Instant::now(), system_monotonic()));
    let now = tokio::time::Instant::now();
    if now >= at { since_start_at + (now - at) } else { since_start_at.saturating_sub(at - now) }
}

/// The monotonic clock plus the time the machine spent suspended, as the kernel counts it.
#[cfg(target_os = "linux")]
fn boot_time() -> Duration {
    read(rustix::time::ClockId::Boottime)
}

#[cfg(all(target_os = "linux", not(any(test, feature = "test-util"))))]
fn now_since_boot() -> Duration {
    boot_time()
}

/// The same, with the monotonic part read through tokio (a paused test clock): tokio's
/// monotonic time plus boot time minus the system's monotonic time.
#[cfg(all(target_os = "linux", any(test, feature = "test-util")))]
fn now_since_boot() -> Duration {
    let suspended = boot_time().saturating_sub(system_monotonic());
    monotonic_now() + suspended
}

#[cfg(all(target_os = "linux", any(test, feature = "test-util")))]
fn system_monotonic() -> Duration {
    read(rustix::time::ClockId::Monotonic)
}

#[cfg(target_os = "linux")]
fn read(clock: rustix::time::ClockId) -> Duration {
    let ts = rustix::time::clock_gettime(clock);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn now_since_boot() -> Duration {
    // Elsewhere the monotonic clock is the best portable choice; see the module docs.
    monotonic_now()
}

#[cfg(not(target_os = "linux"))]
fn system_monotonic() -> Duration {
    Duration::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a paused tokio clock, deadlines follow it.
    #[tokio::test(start_paused = true)]
    async fn follows_a_paused_clock() {
        let a = BootInstant::now();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let b = BootInstant::now();
        assert!(b.duration_since(a) >= Duration::from_secs(30));
        assert!(b.duration_since(a) < Duration::from_secs(31));
    }

    /// Off a paused clock, the reading that follows tokio and the boot clock read alone (what
    /// builds without `test-util` use) move together. (Their difference is constant, not zero,
    /// when another test first read the clock under a paused runtime.)
    #[cfg(target_os = "linux")]
    #[test]
    fn the_boot_clock_alone_moves_as_the_tokio_following_one() {
        let (alone, following) = (boot_time(), now_since_boot());
        std::thread::sleep(Duration::from_millis(20));
        let (alone_later, following_later) = (boot_time(), now_since_boot());
        let moved = alone_later - alone;
        let followed = following_later - following;
        assert!(moved >= Duration::from_millis(20), "{moved:?}");
        let apart = moved.abs_diff(followed);
        assert!(apart < Duration::from_millis(2), "{moved:?} {followed:?}");
    }

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
