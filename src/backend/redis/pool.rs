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
    sync::Arc,
    time::Duration,
};

use bb8_redis::RedisConnectionManager;
use redis::{AsyncConnectionConfig, RedisError, aio::MultiplexedConnection};

use super::target::Target;

/// A bb8 manager of multiplexed connections that knows when one broke. Each new connection
/// goes to the server the [`Target`] names at that moment (after a failover, the new master).
#[derive(Clone, Debug)]
pub(super) struct Manager {
    target: Arc<Target>,
    connect_timeout: Duration,
}

impl Manager {
    pub(super) fn new(target: Arc<Target>, connect_timeout: Duration) -> Self {
        Self {
            target,
            connect_timeout,
        }
    }
}

/// A multiplexed connection with a flag for "do not reuse".
#[derive(Debug)]
pub(super) struct Tracked {
    conn: MultiplexedConnection,
    broken: bool,
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
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Tracked {
            conn,
            broken: false,
        })
    }

    async fn is_valid(&self, conn: &mut Tracked) -> Result<(), RedisError> {
        redis::cmd("PING").query_async::<()>(&mut conn.conn).await
    }

    fn has_broken(&self, conn: &mut Tracked) -> bool {
        conn.broken
    }
}

/// The backend's pool: its own, or the application's.
#[derive(Clone, Debug)]
pub(super) enum Pool {
    Own(bb8::Pool<Manager>),
    Shared(bb8::Pool<RedisConnectionManager>),
}

/// A checked-out connection.
pub(super) enum Conn<'a> {
    Own(bb8::PooledConnection<'a, Manager>),
    Shared(bb8::PooledConnection<'a, RedisConnectionManager>),
}

impl Pool {
    pub(super) async fn get(&self) -> Result<Conn<'_>, bb8::RunError<RedisError>> {
        Ok(match self {
            Self::Own(pool) => Conn::Own(pool.get().await?),
            Self::Shared(pool) => Conn::Shared(pool.get().await?),
        })
    }
}

impl Conn<'_> {
    /// Keeps this connection out of the pool after the current use.
    pub(super) fn mark_broken(&mut self) {
        if let Self::Own(conn) = self {
            conn.broken = true;
        }
    }
}

impl Deref for Conn<'_> {
    type Target = MultiplexedConnection;

    fn deref(&self) -> &MultiplexedConnection {
        match self {
            Self::Own(conn) => &conn.conn,
            Self::Shared(conn) => conn,
        }
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut MultiplexedConnection {
        match self {
            Self::Own(conn) => &mut conn.conn,
            Self::Shared(conn) => &mut *conn,
        }
    }
}
