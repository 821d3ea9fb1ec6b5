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
use tokio::time::Instant;

use super::{
    quarantine::{self, Quarantine},
    server_clock::ServerClock,
    target::Target,
};
use crate::error::{BackendError, BackendErrorKind};

/// Opens the backend's connections, and knows when the server of each booted. Each new
/// connection goes to the server the [`Target`] names at that moment (after a failover, the
/// new master).
#[derive(Clone, Debug)]
pub(super) struct Manager {
    target: Arc<Target>,
    connect_timeout: Duration,
    quarantine: Arc<Quarantine>,
    /// Whether a switch to another server (a Sentinel failover) counts as a boot: a promoted
    /// replica may have missed the last grants, unless every grant waited for a replica.
    failover_boots: bool,
    /// The server the last connection went to, and when it booted as far as locks go (a
    /// failover's moment counts for every later connection to it).
    last_server: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Manager {
    pub(super) fn new(
        target: Arc<Target>,
        connect_timeout: Duration,
        quarantine: Arc<Quarantine>,
        failover_boots: bool,
    ) -> Self {
        Self {
            target,
            connect_timeout,
            quarantine,
            failover_boots,
            last_server: Arc::default(),
        }
    }

    /// When the server `conn` goes to booted, as far as its locks go: its own boot, or the
    /// moment this process first saw it replace another server. `None` with the quarantine off.
    async fn booted(
        &self,
        server: String,
        conn: &mut MultiplexedConnection,
    ) -> Result<Option<Instant>, RedisError> {
        if !self.quarantine.is_on() {
            return Ok(None);
        }
        let mut booted = quarantine::boot_time(conn).await?;
        {
            let mut last = self
                .last_server
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match last.as_ref() {
                Some((same, recorded)) if *same == server => booted = booted.max(*recorded),
                Some((previous, _)) if self.failover_boots => {
                    tracing::warn!(
                        %server,
                        %previous,
                        "the lock store moved to another server (failover): treating it as restarted"
                    );
                    booted = Instant::now();
                }
                _ => {}
            }
            *last = Some((server, booted));
        }
        Ok(Some(booted))
    }
}

/// A multiplexed connection with a flag for "do not reuse", shared by the clones in use.
#[derive(Debug)]
struct Tracked {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// When its server booted (for the quarantine); `None` when not asked.
    booted: Option<Instant>,
    /// Its server's clock, read when it opened.
    clock: Option<ServerClock>,
}

impl Tracked {
    /// A handle for one command, unless the connection broke.
    fn handle(&self) -> Option<Conn> {
        (!self.broken.load(Ordering::Relaxed)).then(|| Conn {
            conn: self.conn.clone(),
            broken: Some(self.broken.clone()),
            booted: self.booted,
            clock: self.clock,
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
        let server = client.get_connection_info().addr().to_string();
        let booted = self.booted(server, &mut conn).await?;
        let clock = ServerClock::read(&mut conn).await?;
        Ok(Tracked {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
            booted,
            clock,
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

/// A connection for one command (or one batch): a clone of a multiplexed connection.
///
/// A multiplexed connection carries any number of requests at once, so a command does not keep
/// it to itself: `pool_size` is the number of sockets, not a cap on commands in flight.
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    /// The connection's flag, for connections of the backend's own.
    broken: Option<Arc<AtomicBool>>,
    /// When its server booted, for the backend's own connections with the quarantine on.
    booted: Option<Instant>,
    /// Its server's clock, for the backend's own connections.
    clock: Option<ServerClock>,
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
                    broken: None,
                    booted: None,
                    clock: None,
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
        if let Some(broken) = &self.broken {
            broken.store(true, Ordering::Relaxed);
        }
    }

    /// When the server of this connection booted, when known.
    pub(super) fn booted(&self) -> Option<Instant> {
        self.booted
    }

    /// Its server's clock, when known.
    pub(super) fn clock(&self) -> Option<&ServerClock> {
        self.clock.as_ref()
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
