//! The server's clock as a client can bound it, for the single hold's absolute expiry.
//!
//! A single hold (`SET NX`, see `lua/acquire.lua`) is written with `PXAT`: an absolute expiry
//! on the server's clock, the send time's upper bound plus the lease. A copy of that `SET`
//! held back on its connection and delivered late therefore ends no later than a hold sent on
//! time, and one delivered after that moment creates nothing; the undo of the attempt keeps
//! its record of the attempt until the same moment (`lua/abandon.lua`), so the late copy never
//! outlives the record that names it given up.
//!
//! The bound comes from one `TIME` asked when the connection opens: the server read its clock
//! after the request left, so the reading plus the local time elapsed since the request left
//! is at least the server's clock (clock rates differ by far less than the lease's drift
//! margin). An upper bound keeps the hold at least as long as the client trusts it.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use redis::{RedisError, aio::ConnectionLike};
use tokio::time::Instant;

/// An upper bound of one server's clock, from one reading.
#[derive(Clone, Copy, Debug)]
pub(super) struct ServerClock {
    /// When the request that read the server's clock left.
    asked: Instant,
    /// The server's clock then, at most: its reading (ms since the Unix epoch), rounded up.
    server_ms: u64,
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
            asked,
            server_ms: seconds * 1000 + micros.div_ceil(1000),
        }))
    }

    /// The server's clock now, at most, in ms since the Unix epoch.
    pub(super) fn now_at_most(&self) -> u64 {
        let elapsed = self.asked.elapsed();
        let elapsed_ms = u64::try_from(elapsed.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        self.server_ms.saturating_add(elapsed_ms)
    }
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

    #[test]
    fn pxat_needs_redis_6_2() {
        assert!(takes_pxat("# Server\r\nredis_version:7.0.15\r\n"));
        assert!(takes_pxat("# Server\r\nredis_version:6.2.0\r\n"));
        assert!(!takes_pxat("# Server\r\nredis_version:6.0.20\r\n"));
        assert!(!takes_pxat("# Server\r\nuptime_in_seconds:4\r\n"));
    }
}
