//! Quarantine after a restart: a server that has been up for less than the longest lease any
//! client may still hold grants nothing new.
//!
//! A Redis restarted without persistence (or from an append-only file that missed its last
//! second, or a replica promoted before it received the last grants) has forgotten locks whose
//! holders still run their critical sections: each believes it holds until its own deadline,
//! at most one lease after its last grant or renewal, which happened before the restart. So
//! a server that booted less than one lease ago must not grant, and after that it may.
//!
//! The restart is told by the server itself, never by comparing clocks: every connection the
//! backend opens asks `INFO server` for `uptime_in_seconds` once, and a connection cannot
//! outlive the server it was opened to, so each command knows when its server booted (by this
//! process's monotonic clock). An acquire sent on a connection whose server is still in
//! quarantine is not sent: it answers "held, try again when the quarantine ends". Renewals and
//! releases go on as usual.
//!
//! An application's pool ([`RedisBackendBuilder::pool`](super::RedisBackendBuilder::pool)) opens
//! its connections itself, so there the acquire scripts check the server's start themselves
//! ([`boot_check`]), from what the server says of itself: `LASTSAVE`, which Redis sets to the
//! time of every start and every save, against a boot marker key that holds the `LASTSAVE` of a
//! server run already seen up for a whole quarantine. A snapshot or an append-only file keeps
//! the marker but not the run: a restarted server's `LASTSAVE` differs, and the script asks
//! `INFO server` for its uptime before it grants.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redis::{RedisError, RedisResult, aio::ConnectionLike};
use tokio::time::Instant;

/// How long a freshly booted server grants nothing new.
#[derive(Debug)]
pub(super) struct Quarantine {
    /// Set with [`RedisBackendBuilder::quarantine`](super::RedisBackendBuilder::quarantine),
    /// in milliseconds; [`FOLLOW_LEASES`] when not set.
    fixed_ms: AtomicU64,
    /// Otherwise: the longest lease this process's clients use, in milliseconds.
    longest_lease_ms: AtomicU64,
    /// When an operator was last told that acquires are held back.
    last_warned: Mutex<Option<Instant>>,
}

impl Quarantine {
    /// A quarantine of `fixed`, or (with `None`) of the longest lease in use.
    pub(super) fn new(fixed: Option<Duration>) -> Self {
        let quarantine = Self {
            fixed_ms: AtomicU64::new(FOLLOW_LEASES),
            longest_lease_ms: AtomicU64::new(0),
            last_warned: Mutex::new(None),
        };
        if let Some(fixed) = fixed {
            quarantine.set(fixed);
        }
        quarantine
    }

    /// Fixes the quarantine at `quarantine`.
    pub(super) fn set(&self, quarantine: Duration) {
        let millis = u64::try_from(quarantine.as_millis()).unwrap_or(FOLLOW_LEASES - 1);
        self.fixed_ms
            .store(millis.min(FOLLOW_LEASES - 1), Ordering::Relaxed);
    }

    /// Records that a client of this backend uses leases of `lease`.
    pub(super) fn note_lease(&self, lease: Duration) {
        let millis = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        // Called on every acquire: written only when longer, so the cache line stays shared.
        if millis > self.longest_lease_ms.load(Ordering::Relaxed) {
            self.longest_lease_ms.fetch_max(millis, Ordering::Relaxed);
        }
    }

    /// How long the quarantine is now.
    pub(super) fn length(&self) -> Duration {
        match self.fixed_ms.load(Ordering::Relaxed) {
            FOLLOW_LEASES => Duration::from_millis(self.longest_lease_ms.load(Ordering::Relaxed)),
            fixed => Duration::from_millis(fixed),
        }
    }

    /// Whether the backend must learn when its server booted: not when the quarantine was
    /// turned off, which also spares the `INFO` grant.
    pub(super) fn is_on(&self) -> bool {
        self.fixed_ms.load(Ordering::Relaxed) != 0
    }

    /// How much longer a server up for `uptime` grants nothing new, if at all.
    pub(super) fn remaining_after(&self, uptime: Duration) -> Option<Duration> {
        self.length()
            .checked_sub(uptime)
            .filter(|left| !left.is_zero())
    }

    /// Tells the operator, at most every few seconds, that acquires are held back for `left`.
    pub(super) fn held_back(&self, key: &str, left: Duration) {
        let now = Instant::now();
        {
            let mut last = self
                .last_warned
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| now < at + WARN_EVERY) {
                tracing::debug!(key, ?left, "lock store in quarantine after a start");
                return;
            }
            *last = Some(now);
        }
        tracing::warn!(
            key,
            quarantine_left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            "the lock store started less than a lease ago: it grants no new lock until every \
             lease it may have forgotten has run out (RedisBackendBuilder::quarantine)"
        );
    }

    /// How much longer a server that booted at `booted` grants nothing new, if at all.
    pub(super) fn remaining(&self, booted: Instant) -> Option<Duration> {
        self.remaining_after(booted.elapsed())
    }
}

/// When the server behind `conn` booted, from its own uptime (see [`uptime`]): never earlier
/// than the real boot, so the quarantine errs long, by up to two seconds.
pub(super) async fn boot_time<C: ConnectionLike>(conn: &mut C) -> RedisResult<Instant> {
    let asked = Instant::now();
    let uptime = uptime(conn).await?;
    Ok(asked.checked_sub(uptime).unwrap_or(asked))
}

/// How long the server behind `conn` has been up at least (`INFO server`). Redis counts
/// `uptime_in_seconds` between two clock readings truncated to whole seconds, so it can be a
/// second more than the real uptime: one second is taken off.
async fn uptime<C: ConnectionLike>(conn: &mut C) -> RedisResult<Duration> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let seconds = uptime_of(&info).ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::Parse,
            "INFO server has no uptime_in_seconds",
        ))
    })?;
    Ok(Duration::from_secs(seconds.saturating_sub(1)))
}

/// How often a held-back acquire is logged as a warning.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// The quarantine's length when none is set: follow the longest lease.
const FOLLOW_LEASES: u64 = u64::MAX;

/// The boot check an acquire script runs for the locks named like `lock` with a quarantine of
/// `length` (`boot_unverified` in `lua/prelude.lua`): `<length in ms>:<marker>`.
///
/// The marker key is one per prefix and namespace, under the lock's prefix (so the crate's ACL
/// key pattern covers it), and never a lock's name nor one of its keys, whose hash tags are
/// never empty. It holds the `LASTSAVE` (Unix seconds) of the server run that a script last saw
/// up for a whole quarantine, written by that script (never by the client) with a one-day TTL.
/// A script whose server's `LASTSAVE` is another grants only once `INFO server` says the server
/// has been up for the quarantine, and then writes the marker anew.
pub(super) fn boot_check(lock: &str, length: Duration) -> String {
    let namespace = lock.find('{').map_or(lock, |brace| &lock[..brace]);
    format!("{}:{namespace}{{}}:boot", length.as_millis())
}

/// `uptime_in_seconds` of an `INFO server` reply.
fn uptime_of(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_is_read_from_the_server_section() {
        let info =
            "# Server\r\nredis_version:7.0.15\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n";
        assert_eq!(uptime_of(info), Some(42));
        assert_eq!(uptime_of("# Server\r\nredis_version:7.0.15\r\n"), None);
    }

    #[test]
    fn the_boot_marker_is_no_lock_key() {
        let quarantine = Duration::from_millis(2500);
        assert_eq!(
            boot_check("tower-lock:{alice}", quarantine),
            "2500:tower-lock:{}:boot"
        );
        assert_eq!(
            boot_check("tl:POST%20x{a}", quarantine),
            "2500:tl:POST%20x{}:boot"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_longest_lease_unless_fixed() {
        let auto = Quarantine::new(None);
        auto.note_lease(Duration::from_secs(3));
        auto.note_lease(Duration::from_secs(1));
        assert_eq!(auto.length(), Duration::from_secs(3));
        let booted = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(auto.remaining(booted), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(auto.remaining(booted), None);

        assert_eq!(
            auto.remaining_after(Duration::from_secs(1)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(auto.remaining_after(Duration::from_secs(3)), None);

        let off = Quarantine::new(Some(Duration::ZERO));
        off.note_lease(Duration::from_secs(30));
        assert!(!off.is_on());
        assert_eq!(off.remaining(Instant::now()), None);
    }
}
