//! Where commands go: one node through the pool, or a Redis Cluster through redis-rs's cluster
//! connection, which routes each command by its first key and follows `MOVED` and `ASK`.
//!
//! Both hand out a [`Conn`] that speaks redis-rs's `ConnectionLike`, so scripts, replies and
//! errors are handled by the same code whatever the transport.

use std::sync::{Arc, atomic::Ordering};

use redis::{
    Cmd, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, MultiplexedConnection},
};

#[cfg(feature = "cluster")]
use super::{cluster::Cluster, scripts::SHARDED_SCRIPTS};
use super::{
    pool::{ConnState, Pool},
    scripts::{SCRIPTS, Scripts},
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
            Self::Node { pool, .. } => pool.get().await,
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster) => Ok(Conn {
                link: Link::Cluster(cluster.connection()),
                state: None,
            }),
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

    /// Whether this is a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        !matches!(self, Self::Node { .. })
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

/// A connection for one command (or one batch): a clone of a multiplexed connection (or of
/// the cluster connection), which carries any number of requests at once.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(super) link: Link,
    /// For the backend's own connections to one node.
    pub(super) state: Option<Arc<ConnState>>,
}

#[derive(Clone)]
pub(super) enum Link {
    Node(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Keeps the backend's own connection from further use: the next command opens a new one.
    /// (The cluster connection repairs its node connections itself.)
    pub(super) fn mark_broken(&mut self) {
        if let Some(state) = &self.state {
            state.broken.store(true, Ordering::Relaxed);
        }
    }

    /// What the backend's own connection read of its server and learnt since.
    pub(super) fn state(&self) -> Option<Arc<ConnState>> {
        self.state.clone()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.link {
            Link::Node(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.link {
            Link::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Node(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}
