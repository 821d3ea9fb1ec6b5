//! The connections a backend sends commands on, and how one that broke is replaced.
//!
//! A redis-rs multiplexed connection carries any number of requests at once, so a command
//! never keeps one to itself: it clones a handle and sends. The backend's own connections
//! ([`Connections`]) are a fixed set used in turn, with nothing to check out or put back. A
//! multiplexed connection whose socket died fails every later command, so each carries a flag
//! the backend sets after a connection-level error, or after a command found no reply within
//! its time budget (the connection may be half-open, or a reply may be owed to a request the
//! server never saw); the next command on that place opens a new one. Pools handed in by the
//! application ([`RedisBackendBuilder::pool`](super::RedisBackendBuilder::pool)) keep their own
//! policy (bb8 tests connections on checkout by default).

use std::{
    ops::{Deref, DerefMut},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bb8_redis::RedisConnectionManager;
use redis::{AsyncConnectionConfig, RedisError, aio::MultiplexedConnection};

use super::{server_clock::ServerClock, target::Target};
use crate::error::{BackendError, BackendErrorKind};

/// Opens the backend's connections. Each new connection goes to the server the [`Target`]
/// names at that moment (after a failover, the new master).
#[derive(Clone, Debug)]
pub(super) struct Manager {
    pub(super) target: Arc<Target>,
    pub(super) connect_timeout: Duration,
}

/// What the commands on one connection share: its flags, and what it read of its server when
/// it opened.
#[derive(Debug, Default)]
pub(super) struct ConnState {
    /// Do not reuse: the connection failed, or stayed silent for a whole time budget.
    broken: AtomicBool,
    /// An acquire script on it answered past the quarantine check: its server run is over its
    /// quarantine, and the uncontended `SET NX` may be used.
    pub(super) run_verified: AtomicBool,
    /// Its server's clock, when it can bound it.
    pub(super) clock: Option<ServerClock>,
    /// Its server's run id (`''` when not known).
    pub(super) run: String,
}

/// A multiplexed connection and what its commands share.
#[derive(Debug)]
struct Tracked {
    conn: MultiplexedConnection,
    shared: Arc<ConnState>,
}

impl Tracked {
    /// A handle for one command, unless the connection broke.
    fn handle(&self) -> Option<Conn> {
        (!self.shared.broken.load(Ordering::Relaxed)).then(|| Conn {
            conn: self.conn.clone(),
            state: Some(self.shared.clone()),
        })
    }
}

/// Opening a connection, boxed: its future stays out of the type of every command's future
/// (deeply nested future types exceed the compiler's limits where callers spawn them).
type Opening<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Tracked, RedisError>> + Send + 'a>>;

impl Manager {
    fn connect(&self) -> Opening<'_> {
        Box::pin(self.open())
    }

    async fn open(&self) -> Result<Tracked, RedisError> {
        let client = self.target.client().await?;
        // The backend bounds every command by its own budget (the command timeout, plus the
        // `WAIT` timeout for acknowledged grants): redis-rs's default 500 ms reply timeout
        // would cut a longer budget short.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let (clock, run) = ServerClock::read(&mut conn).await?;
        let shared = ConnState {
            clock,
            run: run.unwrap_or_default(),
            ..ConnState::default()
        };
        Ok(Tracked {
            conn,
            shared: Arc::new(shared),
        })
    }
}

/// The backend's own connections: a fixed number of places, used in turn, each holding a
/// multiplexed connection once one was opened there.
#[derive(Debug)]
pub(super) struct Connections {
    manager: Manager,
    places: Box<[Place]>,
    next: AtomicUsize,
}

#[derive(Debug, Default)]
struct Place {
    current: Mutex<Option<Tracked>>,
    /// Held while a connection is opened here, so a burst opens one, not one per command.
    opening: tokio::sync::Mutex<()>,
}

impl Place {
    /// A handle on this place's connection, dropping it when it broke.
    fn ready(&self) -> Option<Conn> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let handle = current.as_ref().and_then(Tracked::handle);
        if handle.is_none() {
            *current = None;
        }
        handle
    }

    /// A handle on this place's connection, opened first when it has none.
    async fn connection(&self, manager: &Manager) -> Result<Conn, RedisError> {
        if let Some(conn) = self.ready() {
            return Ok(conn);
        }
        let _opening = self.opening.lock().await;
        // Another command may have opened it while this one waited.
        if let Some(conn) = self.ready() {
            return Ok(conn);
        }
        let tracked = manager.connect().await?;
        let conn = tracked.handle().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::Io, "a new connection broke at once"))
        })?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(tracked);
        Ok(conn)
    }
}

impl Connections {
    pub(super) fn new(manager: Manager, size: u32) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        Self {
            manager,
            places: (0..size).map(|_| Place::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A connection for one command: the next place's.
    pub(super) async fn get(&self) -> Result<Conn, RedisError> {
        let place = &self.places[self.next.fetch_add(1, Ordering::Relaxed) % self.places.len()];
        place.connection(&self.manager).await
    }

    /// Opens the connection of every place that has none (one that fails is opened again by
    /// the command that next needs it).
    pub(super) async fn open_all(&self) {
        let all = self
            .places
            .iter()
            .map(|place| place.connection(&self.manager));
        futures_util::future::join_all(all).await;
    }
}

/// Where the backend's connections come from: its own, or the application's pool.
#[derive(Debug)]
pub(super) enum Pool {
    Own(Connections),
    Shared(bb8::Pool<RedisConnectionManager>),
}

/// A connection for one command (or one batch): a clone of a multiplexed connection, which
/// carries any number of requests at once (`pool_size` is the number of sockets, not a cap on
/// commands in flight).
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    /// For the backend's own connections.
    state: Option<Arc<ConnState>>,
}

impl Pool {
    pub(super) async fn get(&self) -> Result<Conn, BackendError> {
        match self {
            // Nothing was sent when no connection could be opened.
            Self::Own(connections) => connections
                .get()
                .await
                .map_err(|error| BackendError::new(BackendErrorKind::Unavailable, error)),
            Self::Shared(pool) => match pool.get().await {
                Ok(pooled) => Ok(Conn {
                    conn: pooled.clone(),
                    state: None,
                }),
                Err(bb8::RunError::User(error)) => {
                    Err(BackendError::new(BackendErrorKind::Unavailable, error))
                }
                Err(bb8::RunError::TimedOut) => {
                    Err(BackendError::from_kind(BackendErrorKind::Unavailable))
                }
            },
        }
    }
}

impl Conn {
    /// Keeps this connection out of the pool: it is dropped at its next return.
    pub(super) fn mark_broken(&mut self) {
        if let Some(state) = &self.state {
            state.broken.store(true, Ordering::Relaxed);
        }
    }

    /// What the backend's own connection read of its server and learnt since; `None` for an
    /// application's pool.
    pub(super) fn state(&self) -> Option<Arc<ConnState>> {
        self.state.clone()
    }
}

impl Deref for Conn {
    type Target = MultiplexedConnection;

    fn deref(&self) -> &MultiplexedConnection {
        &self.conn
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut MultiplexedConnection {
        &mut self.conn
    }
}
