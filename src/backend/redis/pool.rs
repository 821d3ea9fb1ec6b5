//! The connections a backend sends commands on, and how one that broke is replaced.
//!
//! A multiplexed connection carries any number of requests at once: a command clones a handle
//! and sends. The backend's own connections are a fixed set of places used in turn, each with
//! a flag set after a connection-level error or a command that got no reply in time (it may be
//! half-open); the next command on that place opens a new one. An application's pool keeps its
//! own policy.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bb8_redis::RedisConnectionManager;
use redis::{AsyncConnectionConfig, RedisError, aio::ConnectionLike};
use tokio::time::Instant;

use super::transport::{Conn, Link, Target};
use crate::{
    error::{BackendError, BackendErrorKind},
    lease::Lease,
};

/// What the commands on one of the backend's own connections share.
#[derive(Debug, Default)]
pub(super) struct ConnState {
    /// Do not reuse: the connection failed, or stayed silent for a whole time budget.
    pub(super) broken: AtomicBool,
    /// An acquire script on it answered past the quarantine check: its server run is over its
    /// quarantine, and the uncontended `SET NX` may be used.
    pub(super) run_verified: AtomicBool,
    /// Its server's clock, read when it opened, when it can bound it.
    pub(super) clock: Option<ServerClock>,
    /// Its server's run id, read when it opened (`''` when not known).
    pub(super) run: String,
}

/// Where the backend's connections come from: its own, or the application's pool.
pub(super) enum Pool {
    Own(Connections),
    Shared(bb8::Pool<RedisConnectionManager>),
}

impl Pool {
    /// A connection for one command; nothing was sent when there is none.
    pub(super) async fn get(&self) -> Result<Conn, BackendError> {
        let unavailable = |error| BackendError::new(BackendErrorKind::Unavailable, error);
        match self {
            Self::Own(connections) => connections.get().await.map_err(unavailable),
            Self::Shared(pool) => match pool.get().await {
                Ok(pooled) => Ok(Conn { link: Link::Node(pooled.clone()), state: None }),
                Err(bb8::RunError::User(error)) => Err(unavailable(error)),
                Err(bb8::RunError::TimedOut) => {
                    Err(BackendError::from_kind(BackendErrorKind::Unavailable))
                }
            },
        }
    }
}

/// The backend's own connections: a fixed number of places, used in turn, each holding a
/// connection once one was opened there, to the server the [`Target`] names at that moment.
pub(super) struct Connections {
    target: Arc<Target>,
    connect_timeout: Duration,
    places: Box<[Place]>,
    next: AtomicUsize,
}

#[derive(Default)]
struct Place {
    current: Mutex<Option<Conn>>,
    /// Held while a connection is opened here, so a burst opens one, not one per command.
    opening: tokio::sync::Mutex<()>,
}

/// Opening a connection, boxed: its future stays out of the type of every command's future
/// (deeply nested future types exceed the compiler's limits where callers spawn them).
type Opening<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Conn, RedisError>> + Send + 'a>>;

impl Connections {
    pub(super) fn new(target: Arc<Target>, connect_timeout: Duration, size: u32) -> Self {
        Self {
            target,
            connect_timeout,
            places: (0..size.max(1)).map(|_| Place::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A connection for one command: the next place's.
    pub(super) async fn get(&self) -> Result<Conn, RedisError> {
        let next = self.next.fetch_add(1, Ordering::Relaxed);
        self.connection(&self.places[next % self.places.len()]).await
    }

    /// Opens the connection of every place that has none (one that fails is opened by the
    /// command that next needs it).
    pub(super) async fn open_all(&self) {
        let all = self.places.iter().map(|place| self.connection(place));
        futures_util::future::join_all(all).await;
    }

    /// A handle on `place`'s connection, opened first when it has none or it broke.
    async fn connection(&self, place: &Place) -> Result<Conn, RedisError> {
        let ready = || {
            let mut current = place.current.lock().unwrap_or_else(PoisonError::into_inner);
            let broken =
                |conn: &Conn| conn.state.as_ref().is_none_or(|s| s.broken.load(Ordering::Relaxed));
            current.take_if(|conn| broken(conn));
            current.clone()
        };
        if let Some(conn) = ready() {
            return Ok(conn);
        }
        let _opening = place.opening.lock().await;
        // Another command may have opened it while this one waited.
        if let Some(conn) = ready() {
            return Ok(conn);
        }
        let conn = self.open().await?;
        *place.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    fn open(&self) -> Opening<'_> {
        Box::pin(async {
            let client = self.target.client().await?;
            // Every command has a budget of the backend's (with the waits of acknowledged
            // grants, longer than redis-rs's default 500 ms reply timeout).
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(None);
            let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
            let (clock, run) = ServerClock::read(&mut conn).await?;
            let state = ConnState { clock, run: run.unwrap_or_default(), ..ConnState::default() };
            Ok(Conn { link: Link::Node(conn), state: Some(Arc::new(state)) })
        })
    }
}

/// A server's clock as a client can bound it, from one `TIME` asked when the connection
/// opened: for the "not after" of an acquire (the latest server time at which it may act, see
/// `lua/acquire.lua`) and the absolute expiry of the uncontended `SET NX PXAT`, the same
/// moment: the send time's lower bound plus the lease. A request held back on its connection
/// and delivered late then does nothing, or (a `SET`) ends when a copy sent on time would
/// have; its undo keeps `:void` for a lease from when it runs, which is later.
///
/// The server read its clock between the request leaving and the reply arriving, so its clock
/// now is at least the reading plus the time elapsed since the reply, and at most that plus
/// the round trip (clock rates differ by far less than the lease's drift margin).
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
        let reply: Result<((u64, u64), String), RedisError> =
            redis::pipe().cmd("TIME").cmd("INFO").arg("server").query_async(conn).await;
        let answered = Instant::now();
        let ((seconds, micros), info) = match reply {
            Ok(reply) => reply,
            // The server answered, but not with a clock: it can do without.
            Err(error) if error.code().is_some() => return Ok((None, None)),
            Err(error) => return Err(error),
        };
        let field =
            |name: &str| info.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
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
        let at_least = self.server_ms.saturating_add(whole_ms(self.answered.elapsed()));
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
