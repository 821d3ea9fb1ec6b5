//! How long a lock lives without its holder's attention.

use std::time::Duration;

use crate::{clock::BootInstant, engine::MIN_LEASE};

/// The longest lease: 365 days. Every store keeps a lock's expiry well within its range then.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How long a lock stays valid in the backend, and whether the watchdog extends it.
///
/// With [`Lease::watchdog`] (the default, 5 seconds) the client's watchdog renews the lease every
/// third of its length for as long as the guard is held, so a crashed process frees the lock
/// within one lease while a slow one keeps it. With [`Lease::fixed`] the lock simply expires after
/// the given time, whether or not the guard is still held; the guard then reports itself lost.
/// It does so a little before the store lets the lock go (1 % of the lease plus 2 ms, for clock
/// rate differences), and the client leaves the lock to expire in the store: no other holder
/// gets it before the whole lease has run out.
///
/// A lease is 3 ms to 365 days long: an acquire with another fails at once with
/// [`LockError::InvalidLease`](crate::LockError::InvalidLease), and a client built with one
/// fails to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    duration: Duration,
    renewed: bool,
}

impl Lease {
    /// The default watchdog lease: 5 s, renewed every 1.67 s while held.
    ///
    /// Short, because the default lease is also how long a Redis restarted without persistence
    /// refuses new grants (its quarantine): a holder that cannot renew gives up within one
    /// lease, so no one may be granted its lock before that. A 5 s lease makes a 3 s restart
    /// cost about 8 s of refusals rather than half a minute; the price is a renewal every
    /// 1.67 s per held lock (batched per client) and a holder that gives up after about 5 s
    /// without the store. See the failover guide.
    pub const DEFAULT: Self = Self::watchdog(Duration::from_secs(5));

    /// A lease of `duration`, renewed by the watchdog every `duration / 3` while held.
    pub const fn watchdog(duration: Duration) -> Self {
        Self { duration, renewed: true }
    }

    /// A lease of `duration` that is never renewed: the lock expires after it.
    pub const fn fixed(duration: Duration) -> Self {
        Self { duration, renewed: false }
    }

    /// The length of one lease period.
    pub const fn duration(&self) -> Duration {
        self.duration
    }

    /// Whether the watchdog renews this lease.
    pub const fn is_renewed(&self) -> bool {
        self.renewed
    }

    /// Whether a lock can be held with this lease: 3 ms to 365 days.
    pub(crate) fn is_valid(&self) -> bool {
        (MIN_LEASE..=MAX_LEASE).contains(&self.duration)
    }

    /// The interval between renewals.
    pub(crate) fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// How much earlier than the backend the client considers the lease over, to absorb clock
    /// rate differences and scheduling delays: 1 % of the lease plus 2 ms.
    pub(crate) fn drift(&self) -> Duration {
        self.duration / 100 + Duration::from_millis(2)
    }

    /// Until when a grant whose request was sent at `sent_at` may be trusted: the lease, less
    /// the drift margin.
    pub(crate) fn valid_until(&self, sent_at: BootInstant) -> BootInstant {
        sent_at + self.duration - self.drift()
    }

    /// The lease length in whole milliseconds, at least 1.
    #[cfg(feature = "redis")]
    pub(crate) fn millis(&self) -> u64 {
        u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX).max(1)
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self::DEFAULT
    }
}
