//! Timestamps for histories written by several processes.
//!
//! `Instant` cannot be serialised, but `CLOCK_MONOTONIC` is one system-wide clock on Linux, so
//! nanoseconds read from it in a holder process and in the runner can be compared directly.

use std::time::Duration;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub(crate) fn now_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(now.tv_sec).expect("the monotonic clock is positive");
    let nanos = u64::try_from(now.tv_nsec).expect("nanoseconds are positive");
    secs * 1_000_000_000 + nanos
}

/// The time between two timestamps (zero if `later` is not later).
pub(crate) fn between(earlier: u64, later: u64) -> Duration {
    Duration::from_nanos(later.saturating_sub(earlier))
}

/// A timestamp as fractional milliseconds, for figures.
pub(crate) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
