//! Where commands go: one node through the pool, or a Redis Cluster through redis-rs's cluster
//! connection, which routes each command by its first key and follows `MOVED` and `ASK`.
//!
//! Both hand out a [`Conn`] that speaks redis-rs's `ConnectionLike`, so scripts, replies and
//! errors are handled by the same code whatever the transport.

use std::sync::Arc;

use redis::{Cmd, Pipeline, RedisFuture, Value, aio::ConnectionLike};

#[cfg(feature = "cluster")]
use super::{cluster::Cluster, scripts::SHARDED_SCRIPTS};
use super::{
    pool::{self, Pool},
    scripts::{SCRIPTS, Scripts},
    server_clock::ServerClock,
    target::Target,
};
use crate::error::BackendError;

/// The connections of a backend.
pub(super) enum Transport {
    /// One node (or the master Sentinel names): pooled multiplexed connections; `target` also
    /// opens the pub/sub connection.
    Node { pool: Pool, target: Arc<Target> },
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster(Cluster),
}

impl Transport {
    /// A connection for one command (or one batch).
    pub(super) async fn get(&self) -> Result<Conn, BackendError> {
        match self {
            Self::Node { pool, .. } => pool.get().await.map(Conn::Node),
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster) => Ok(Conn::Cluster(cluster.connection())),
        }
    }

    /// The scripts this transport runs: they publish releases the way it listens for them.
    pub(super) fn scripts(&self) -> &'static Scripts {
        match self {
            Self::Node { .. } => &SCRIPTS,
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => &SHARDED_SCRIPTS,
        }
    }

    /// Whether its connections know their server's clock (see [`ServerClock`]): the
    /// backend's own connections to one node do, an application's pool and a cluster do not.
    pub(super) fn knows_server_clock(&self) -> bool {
        matches!(
            self,
            Self::Node {
                pool: Pool::Own(_),
                ..
            }
        )
    }

    /// Where a single-node transport connects (`None` for a cluster).
    pub(super) fn node_target(&self) -> Option<&Arc<Target>> {
        match self {
            Self::Node { target, .. } => Some(target),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => None,
        }
    }

    /// The cluster, when this is one.
    #[cfg(feature = "cluster")]
    pub(super) fn cluster(&self) -> Option<&Cluster> {
        match self {
            Self::Cluster(cluster) => Some(cluster),
            Self::Node { .. } => None,
        }
    }
}

/// A connection checked out of a [`Transport`].
pub(crate) enum Conn {
    Node(pool::Conn),
    /// A handle on the shared cluster connection (cheap to clone).
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Keeps a pooled connection out of the pool after the current use. The cluster connection
    /// repairs its node connections itself.
    pub(super) fn mark_broken(&mut self) {
        match self {
            Self::Node(conn) => conn.mark_broken(),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => {}
        }
    }

    /// When the server this connection goes to booted, when known: for the backend's own pool
    /// of one node, not for an application's pool or a cluster.
    pub(super) fn booted(&self) -> Option<tokio::time::Instant> {
        match self {
            Self::Node(conn) => conn.booted(),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => None,
        }
    }

    /// The clock of the server this connection goes to, when known (as
    /// [`Transport::knows_server_clock`] says, and from Redis 6.2 on).
    pub(super) fn clock(&self) -> Option<&ServerClock> {
        match self {
            Self::Node(conn) => conn.clock(),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}
