//! The quarantine after a restart: a server run that may have forgotten grants whose holders
//! still believe in them grants nothing new until the quarantine has passed since its origin.
//! The acquire scripts decide, from the run marker (`quarantined` in `lua/prelude.lua`); this
//! process only says how long its quarantine is, and tells the operator.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use crate::{clock::BootInstant, lease::Lease};

/// This process's quarantine for one backend.
#[derive(Debug)]
pub(super) struct Quarantine {
    /// The configured length in ms, or the default lease's; 0: off.
    configured_ms: u64,
    /// The longest lease this process asked for, in ms.
    longest_ms: AtomicU64,
    /// Until when the quarantine the operator was last told of lasts ([`BootInstant`] ns): one
    /// warning per quarantine.
    warned_until: AtomicU64,
}

/// Whether this process warned of a lease longer than its quarantine.
static WARNED_LONG_LEASE: AtomicBool = AtomicBool::new(false);

impl Quarantine {
    /// A quarantine of `configured`, by default the default lease's; `Duration::ZERO` is off.
    pub(super) fn new(configured: Option<Duration>) -> Self {
        let configured = configured.unwrap_or(Lease::DEFAULT.duration());
        Self {
            configured_ms: u64::try_from(configured.as_millis()).unwrap_or(u64::MAX),
            longest_ms: AtomicU64::new(0),
            warned_until: AtomicU64::new(0),
        }
    }

    /// Records that an acquire asked for `lease`: the quarantine is never shorter than the
    /// longest lease.
    pub(super) fn note_lease(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        // Called on every acquire: written only when longer, so the cache line stays shared.
        if ms <= self.longest_ms.load(Relaxed) {
            return;
        }
        self.longest_ms.fetch_max(ms, Relaxed);
        if self.is_on() && ms > self.configured_ms && !WARNED_LONG_LEASE.swap(true, Relaxed) {
            tracing::warn!(
                lease_ms = ms,
                quarantine_ms = self.configured_ms,
                "a lease longer than the quarantine after a Redis restart: a restarted server may \
                 grant a lock again before its holder's lease has run out; set \
                 RedisBackendBuilder::quarantine to at least the longest lease on every process"
            );
        }
    }

    /// Whether acquires are checked at all.
    pub(super) fn is_on(&self) -> bool {
        self.configured_ms > 0
    }

    /// The length now: the configured one, or the longest lease asked for when longer.
    pub(super) fn length(&self) -> Duration {
        match self.configured_ms {
            0 => Duration::ZERO,
            ms => Duration::from_millis(ms.max(self.longest_ms.load(Relaxed))),
        }
    }

    /// The check an acquire sends on a connection that saw the server run `run` (`''` when
    /// not known): `<quarantine ms>:<run id>`, if any (see `quarantined` in `lua/prelude.lua`).
    pub(super) fn check(&self, run: &str) -> Option<String> {
        let ms = self.length().as_millis();
        (ms > 0).then(|| format!("{ms}:{run}"))
    }

    /// Tells the operator once per quarantine (at debug after that) that `server` holds
    /// acquires back for `left`.
    pub(super) fn held_back(&self, server: &str, key: &str, left: Duration) {
        let (now, until) = (BootInstant::now(), self.warned_until.load(Relaxed));
        let ends = (now + left).as_nanos();
        if now.as_nanos() < until
            || (self.warned_until.compare_exchange(until, ends, Relaxed, Relaxed)).is_err()
        {
            return tracing::debug!(server, key, ?left, "lock store in quarantine after a start");
        }
        tracing::warn!(
            server,
            key,
            left_ms = left.as_millis(),
            "the lock store's server run may have forgotten grants (a restart or a failover): \
             it grants no new lock until its quarantine is over (RedisBackendBuilder::quarantine)"
        );
    }
}
