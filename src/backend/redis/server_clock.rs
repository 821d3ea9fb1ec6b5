//! The server's clock as a client can bound it, for the single hold's absolute expiry and
//! the time after which an acquire script does nothing (`lua/acquire.lua`, ARGV[9]: the same
//! moment, so a script held back on its way never grants a hold that outlives the record of
//! its undo, nor one whose undo never got through).
//!
//! A single hold (`SET NX`, see `lua/acquire.lua`) is written with `PXAT`: an absolute expiry
//! on the server's clock, the send time's upper bound plus the lease. A copy of that `SET`
//! held back on its connection and delivered late therefore ends no later than a hold sent on
//! time, and one delivered after that moment creates nothing; the undo of the attempt keeps
//! its record of the attempt until the same moment (`lua/abandon.lua`), so the late copy never
//! outlives the record that names it given up.
//!
//! The estimate comes from one `TIME` asked when the connection opens. The server read its
//! clock between the request leaving and the reply arriving, so its clock now is at least the
//! reading plus the local time elapsed since the reply, and at most that plus the round trip
//! (clock rates differ by far less than the lease's drift margin). The expiry is the lower
//! bound plus the lease: the key lives at least as long as the client trusts the hold (the
//! lease less that margin, from the send), and no longer than the lease. A reading whose round
//! trip does not fit in a lease's margin (taken while the server stalled) is not used for that
//! lease: the acquire script grants such a hold.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use redis::{RedisError, aio::ConnectionLike};
use tokio::time::Instant;

use crate::lease::Lease;

/// One server's clock, from one reading.
#[derive(Clone, Copy, Debug)]
pub(super) struct ServerClock {
    /// When the reply to the request that read the server's clock arrived.
    answered: Instant,
    /// The server's clock then, at least: its reading (ms since the Unix epoch, rounded down).
    server_ms: u64,
    /// The reading's round trip: the server's clock when the reply arrived was at most this
    /// much past the reading.
    round_trip: Duration,
}

impl ServerClock {
    /// Reads the clock of the server behind `conn`: `None` when that server cannot take an
    /// absolute expiry (`PXAT` needs Redis 6.2) or refuses to say (an ACL without `+time` or
    /// `+info`); single holds then go through the acquire script.
    pub(super) async fn read(conn: &mut impl ConnectionLike) -> Result<Option<Self>, RedisError> {
        let asked = Instant::now();
        let reply: Result<((u64, u64), String), RedisError> = redis::pipe()
            .cmd("TIME")
            .cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await;
        let answered = Instant::now();
        let ((seconds, micros), info) = match reply {
            Ok(reply) => reply,
            // The server answered, but not with a clock: it can do without.
            Err(error) if error.code().is_some() => return Ok(None),
            Err(error) => return Err(error),
        };
        if !takes_pxat(&info) {
            return Ok(None);
        }
        Ok(Some(Self {
            answered,
            server_ms: seconds.saturating_mul(1000).saturating_add(micros / 1000),
            round_trip: answered - asked,
        }))
    }

    /// The absolute expiry (server ms) of a hold of `lease` sent now: no earlier than the
    /// server's clock now plus the lease less its drift margin, and no later than the server's
    /// clock now plus the lease. `None` when the reading's round trip does not fit in that
    /// margin (it was read while the server or the machine stalled): the acquire script,
    /// which takes the server's own clock, grants the hold instead, so that it never outlives
    /// its lease.
    pub(super) fn expiry(&self, lease: &Lease) -> Option<u64> {
        let at_least = self
            .server_ms
            .saturating_add(whole_ms(self.answered.elapsed()));
        // What the server's clock may be past `at_least`: the round trip, rounded up, and a
        // millisecond for each rounding down (the reading, the time elapsed, the lease).
        let spread = whole_ms(self.round_trip) + 1 + 3;
        (spread <= whole_ms(lease.drift())).then(|| at_least.saturating_add(lease.millis()))
    }
}

/// `duration` in whole milliseconds, rounded down.
fn whole_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The expiries of single holds whose `SET` went unanswered (it may still arrive), by attempt:
/// the undo of such an attempt keeps its record until that moment. Only failed calls write
/// here; an entry is forgotten once a late copy of its `SET` could create nothing any more.
#[derive(Debug, Default)]
pub(super) struct Unanswered {
    /// Attempt -> (the `SET`'s `PXAT`, when to forget it).
    sets: Mutex<HashMap<String, (u64, Instant)>>,
}

impl Unanswered {
    /// A `SET` of `attempt` expiring at `pxat` (server ms) about to be sent, with `lease`: it
    /// is recorded unless [`Sending::answered`] is called (the call failed, ran out of time or
    /// was dropped).
    pub(super) fn sending<'a>(
        &'a self,
        attempt: &'a str,
        pxat: u64,
        lease: Duration,
    ) -> Sending<'a> {
        Sending {
            unanswered: self,
            attempt,
            pxat,
            lease,
            armed: true,
        }
    }

    /// The `PXAT` of `attempt`'s single hold, when its `SET` went unanswered.
    pub(super) fn pxat(&self, attempt: &str) -> Option<u64> {
        let sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        sets.get(attempt).map(|&(pxat, _)| pxat)
    }
}

/// A single hold's `SET` on its way; see [`Unanswered::sending`].
pub(super) struct Sending<'a> {
    unanswered: &'a Unanswered,
    attempt: &'a str,
    pxat: u64,
    lease: Duration,
    armed: bool,
}

impl Sending<'_> {
    /// The server answered: the outcome is known.
    pub(super) fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let now = Instant::now();
        // Past its `PXAT` (by the server's clock, at most a lease and the clock reading's
        // round trip from now) a late copy creates nothing; a second lease covers the rest.
        let forget_at = now + self.lease * 2 + Duration::from_secs(1);
        let mut sets = self
            .unanswered
            .sets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sets.retain(|_, &mut (_, until)| until > now);
        sets.insert(self.attempt.to_owned(), (self.pxat, forget_at));
    }
}

/// Whether the server of an `INFO server` reply takes `SET … PXAT` (Redis 6.2 and newer).
fn takes_pxat(info: &str) -> bool {
    let Some(version) = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
    else {
        return false;
    };
    let mut parts = version.trim().split('.').map(|part| part.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (6, 2),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_expiry_covers_the_trusted_lease_and_no_more_than_the_lease() {
        let lease = Lease::fixed(Duration::from_secs(10));
        let clock = ServerClock {
            answered: Instant::now(),
            server_ms: 1_000_000,
            round_trip: Duration::from_micros(300),
        };
        tokio::time::advance(Duration::from_millis(7)).await;
        // The server's clock is now within 1_000_007 and 1_000_009 (a reading rounded down
        // and the round trip): the lease from the lower bound, the margin covers the rest.
        assert_eq!(clock.expiry(&lease), Some(1_000_007 + 10_000));
        // A slow reading that the margin (102 ms) does not cover is not used: the hold would
        // outlive its lease by what it does not cover.
        let slow = ServerClock {
            round_trip: Duration::from_millis(500),
            ..clock
        };
        assert_eq!(slow.expiry(&lease), None);
        // A longer lease's margin covers it.
        assert!(
            slow.expiry(&Lease::fixed(Duration::from_secs(60)))
                .is_some()
        );
    }

    #[test]
    fn pxat_needs_redis_6_2() {
        assert!(takes_pxat("# Server\r\nredis_version:7.0.15\r\n"));
        assert!(takes_pxat("# Server\r\nredis_version:6.2.0\r\n"));
        assert!(!takes_pxat("# Server\r\nredis_version:6.0.20\r\n"));
        assert!(!takes_pxat("# Server\r\nuptime_in_seconds:4\r\n"));
    }
}
