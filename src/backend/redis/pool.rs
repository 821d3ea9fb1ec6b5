//! The connection pool, and how a connection that broke is kept out of it.
//!
//! A redis-rs multiplexed connection whose socket died fails every later command, and
//! `bb8-redis`'s manager cannot tell, so it would go back into the pool. Pools built by
//! [`RedisBackend::connect`](super::RedisBackend::connect) use [`Manager`], whose connections
//! carry a flag the backend sets after a connection-level error, or after a command found no
//! reply within its time budget (the connection may be half-open, or a reply may be owed to a
//! request the server never saw), so bb8 drops them. Pools handed in by the application
//! ([`RedisBackend::from_pool`](super::RedisBackend::from_pool)) keep their own policy (bb8
//! tests connections on checkout by default).

use std::{
    ops::{Deref, DerefMut},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bb8_redis::RedisConnectionManager;
use redis::{AsyncConnectionConfig, RedisError, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::{
    quarantine::{self, Quarantine},
    target::Target,
};

/// A bb8 manager of multiplexed connections that knows when one broke, and when the server
/// of each booted. Each new connection goes to the server the [`Target`] names at that moment
/// (after a failover, the new master).
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
pub(super) struct Tracked {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// When its server booted (for the quarantine); `None` when not asked.
    booted: Option<Instant>,
}

impl bb8::ManageConnection for Manager {
    type Connection = Tracked;
    type Error = RedisError;

    async fn connect(&self) -> Result<Tracked, RedisError> {
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
        Ok(Tracked {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
            booted,
        })
    }

    async fn is_valid(&self, conn: &mut Tracked) -> Result<(), RedisError> {
        redis::cmd("PING").query_async::<()>(&mut conn.conn).await
    }

    fn has_broken(&self, conn: &mut Tracked) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

/// The backend's pool: its own, or the application's.
#[derive(Clone, Debug)]
pub(super) enum Pool {
    Own(bb8::Pool<Manager>),
    Shared(bb8::Pool<RedisConnectionManager>),
}

/// A connection for one command (or one batch): a clone of a pooled multiplexed connection.
///
/// A multiplexed connection carries any number of requests at once, so a command does not keep
/// it checked out: it is cloned and goes straight back to the pool, and `pool_size` is the
/// number of sockets, not a cap on commands in flight.
pub(super) struct Conn {
    conn: MultiplexedConnection,
    /// The pooled connection's flag, for connections of the backend's own pool.
    broken: Option<Arc<AtomicBool>>,
    /// When its server booted, for connections of the backend's own pool with the quarantine on.
    booted: Option<Instant>,
}

impl Pool {
    pub(super) async fn get(&self) -> Result<Conn, bb8::RunError<RedisError>> {
        match self {
            Self::Own(pool) => loop {
                let pooled = pool.get().await?;
                // One that broke in another clone's hands goes: bb8 drops it on its return.
                if pooled.broken.load(Ordering::Relaxed) {
                    continue;
                }
                return Ok(Conn {
                    conn: pooled.conn.clone(),
                    broken: Some(pooled.broken.clone()),
                    booted: pooled.booted,
                });
            },
            Self::Shared(pool) => Ok(Conn {
                conn: pool.get().await?.clone(),
                broken: None,
                booted: None,
            }),
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
