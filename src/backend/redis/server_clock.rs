//! The server's clock as a client can bound it: the "not after" of an acquire (the latest server
//! time at which it may act, see `lua/acquire.lua`) and the absolute expiry of the uncontended
//! `SET NX PXAT`, the same moment: the send time's lower bound plus the lease. A request held
//! back on its connection and delivered late then does nothing, or (a `SET`) ends when a copy
//! sent on time would have; the undo of its attempt keeps `:void` for a lease from when it
//! runs, which is later.
//!
//! The bound comes from one `TIME` asked when the connection opens. The server read its clock
//! between the request leaving and the reply arriving, so its clock now is at least the reading
//! plus the local time elapsed since the reply, and at most that plus the round trip (clock
//! rates differ by far less than the lease's drift margin). A reading whose round trip does not
//! fit in a lease's margin (taken while the server stalled) is not used for that lease.

use std::time::Duration;

use redis::{RedisError, aio::ConnectionLike};
use tokio::time::Instant;

use crate::lease::Lease;

/// One server's clock, from one reading.
#[derive(Clone, Copy, Debug)]
pub(super) struct ServerClock {
    /// When the reply to the request that read the server's clock arrived.
    pub(super) answered: Instant,
    /// The server's clock then, at least: its reading (ms since the Unix epoch, rounded down).
    pub(super) server_ms: u64,
    /// The reading's round trip: the server's clock when the reply arrived was at most this
    /// much past the reading.
    pub(super) round_trip: Duration,
}

impl ServerClock {
    /// Reads the clock and the run id (`INFO server`'s `run_id`) of the server behind `conn`:
    /// no clock when that server cannot take an absolute expiry (`PXAT` needs Redis 6.2) or
    /// refuses to say (an ACL without `+time` or `+info`); no run id when it does not say.
    pub(super) async fn read(
        conn: &mut impl ConnectionLike,
    ) -> Result<(Option<Self>, Option<String>), RedisError> {
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
            Err(error) if error.code().is_some() => return Ok((None, None)),
            Err(error) => return Err(error),
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
        };
        let run = field("run_id:").map(str::to_owned);
        let version = field("redis_version:").unwrap_or("");
        let mut parts = version.split('.').map(str::parse::<u32>);
        let takes_pxat = matches!((parts.next(), parts.next()),
            (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= (6, 2));
        let clock = takes_pxat.then(|| Self {
            answered,
            server_ms: seconds.saturating_mul(1000).saturating_add(micros / 1000),
            round_trip: answered - asked,
        });
        Ok((clock, run))
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
