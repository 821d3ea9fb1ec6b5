//! The connection pool, and how a connection that broke is kept out of it.
//!
//! A redis-rs multiplexed connection whose socket died fails every later command, and
//! `bb8-redis`'s manager cannot tell, so it would go back into the pool. Pools built by
//! [`RedisBackend::connect`](super::RedisBackend::connect) use [`Manager`], whose connections
//! carry a flag the backend sets after a connection-level error, so bb8 drops them. Pools handed
//! in by the application ([`RedisBackend::from_pool`](super::RedisBackend::from_pool)) keep
//! their own policy (bb8 tests connections on checkout by default).

use std::ops::{Deref, DerefMut};

use bb8_redis::RedisConnectionManager;
use redis::{Client, RedisError, aio::MultiplexedConnection};

/// A bb8 manager of multiplexed connections that knows when one broke.
#[derive(Clone, Debug)]
pub(super) struct Manager {
    client: Client,
}

impl Manager {
    pub(super) fn new(client: Client) -> Self {
        Self { client }
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
        let conn = self.client.get_multiplexed_async_connection().await?;
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
