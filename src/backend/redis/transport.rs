//! How a command reaches the server, within a time budget: one node through the pool, or a
//! Redis Cluster through redis-rs's cluster connection (routed by the first key, following
//! `MOVED` and `ASK`). A node is a fixed address, or the master Sentinel names: every new
//! connection asks the [`Target`] for a client, so after a failover a broken connection's
//! replacement goes to the new master.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use redis::{
    Client, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, MultiplexedConnection},
};

use super::{
    RedisBackend,
    errors::{is_read_only, is_refusal, redis_error},
    health::Trouble,
    pool::{ConnState, Pool},
    scripts::{Call, SCRIPTS, Scripts},
};
#[cfg(feature = "cluster")]
use super::{cluster::Cluster, scripts::SHARDED_SCRIPTS};
use crate::{
    error::{BackendError, BackendErrorKind},
    lock_key::LockKey,
};

/// The connections of a backend.
pub(super) enum Transport {
    /// One node: pooled connections; `target` also opens the pub/sub connection.
    Node { pool: Pool, target: Arc<Target> },
    #[cfg(feature = "cluster")]
    Cluster(Cluster),
}

impl Transport {
    /// A connection for one command (or one batch).
    pub(super) async fn get(&self) -> Result<Conn, BackendError> {
        match self {
            Self::Node { pool, .. } => pool.get().await,
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster) => {
                Ok(Conn { link: Link::Cluster(cluster.conn.clone()), state: None })
            }
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

    /// The server, for messages (never a password).
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Node { target, .. } => target.describe(),
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster) => {
                let nodes: Vec<_> =
                    cluster.nodes.iter().map(|node| node.addr().to_string()).collect();
                format!("the Redis Cluster at {nodes:?}")
            }
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

/// The server behind a backend.
pub(super) enum Target {
    Node(Client),
    /// The master of a Sentinel-monitored group, looked up again for each new connection.
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        /// The group's name.
        name: String,
    },
}

impl Target {
    /// A client for the server to connect to now.
    pub(super) async fn client(&self) -> RedisResult<Client> {
        match self {
            Self::Node(client) => Ok(client.clone()),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { sentinels, name } => {
                let client = sentinels.lock().await.async_get_client().await;
                if let Err(error) = &client {
                    tracing::warn!(master = %name, error = %format_args!("{error:#}"), "sentinels named no reachable master");
                }
                client
            }
        }
    }

    /// The server for messages: its address, or the Sentinel group's name.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Node(client) => client.get_connection_info().addr().to_string(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { name, .. } => format!("the master `{name}` the sentinels name"),
        }
    }
}

impl RedisBackend {
    /// Opens every connection of the backend's own now (within the command timeout), so the
    /// first commands do not pay for connecting.
    pub(super) async fn open_pool(&self) {
        if let Transport::Node { pool: Pool::Own(connections), .. } = &self.inner.transport {
            let _ = tokio::time::timeout(self.inner.command_timeout, connections.open_all()).await;
        }
    }

    /// Runs one script call with the command timeout.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        call: &Call,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let result = self.with_conn(Some(key), async |conn| call.run(conn).await);
        self.name_wrong_type_in(result.await, key).await
    }

    /// Names the type found at `key` in a wrong-type error that does not (a command's own, not
    /// a script's).
    pub(super) async fn name_wrong_type_in<T>(
        &self,
        result: Result<T, BackendError>,
        key: &LockKey,
    ) -> Result<T, BackendError> {
        let Err(error) = result else { return result };
        if !matches!(error.kind(), BackendErrorKind::WrongType { found } if found.is_empty()) {
            return Err(error);
        }
        let found = self.with_conn(Some(key), async |conn| {
            redis::cmd("TYPE").arg(key.as_str()).query_async(conn).await
        });
        let found: String = found.await.unwrap_or_else(|_| "unknown".to_owned());
        tracing::warn!(key = %key, found, "lock key holds a value of another type");
        Err(BackendError::from_kind(BackendErrorKind::WrongType { found }).with_key(key.as_str()))
    }

    /// Checks out a connection and runs `op` on it, all within the command timeout; for the
    /// modules of the crate that run commands of their own on the lock store. A connection
    /// that failed at the connection level, ran out of time, or whose server is no longer a
    /// master, is not used again.
    pub(crate) async fn with_conn<T>(
        &self,
        key: Option<&LockKey>,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        self.with_conn_within(key, self.inner.command_timeout, op).await
    }

    /// [`with_conn`](Self::with_conn) within `budget`.
    pub(super) async fn with_conn_within<T>(
        &self,
        key: Option<&LockKey>,
        budget: Duration,
        op: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, BackendError> {
        let name_key = |error: BackendError| match key {
            Some(key) => error.with_key(key.as_str()),
            None => error,
        };
        // A server known to be down: fail at once rather than wait for a connection.
        let health = &self.inner.health;
        health.check().map_err(name_key)?;
        // One timer for both steps; it is registered only if a step has to wait.
        let out_of_time = tokio::time::sleep(budget);
        tokio::pin!(out_of_time);
        let silent = |kind, what| {
            let error = BackendError::new(kind, format!("no {what} within {budget:?}"));
            (Some(Trouble::Silent), error)
        };
        let result = async {
            // No connection in time: nothing was sent, so the outcome is known.
            let mut conn = tokio::select! {
                biased;
                conn = self.inner.transport.get() => conn.map_err(|error| {
                    (is_refusal(&error).then_some(Trouble::Refused), error)
                })?,
                () = &mut out_of_time => {
                    return Err(silent(BackendErrorKind::Unavailable, "connection"));
                }
            };
            let result = tokio::select! {
                biased;
                result = op(&mut conn) => result,
                () = &mut out_of_time => {
                    // Silent for the whole budget, it may be half-open or cut off: a fresh
                    // one is cheaper than finding out on the next command.
                    conn.mark_broken();
                    return Err(silent(BackendErrorKind::Timeout, "reply"));
                }
            };
            if let Err(error) = &result
                && (error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_timeout()
                    || is_read_only(error))
            {
                conn.mark_broken();
            }
            result.map_err(|error| (None, redis_error(error)))
        }
        .await;
        let error = match result {
            Ok(value) => {
                health.succeeded();
                return Ok(value);
            }
            Err((None, error)) => error,
            Err((Some(trouble), error)) => {
                let (error, probe) = health.failed(trouble, error);
                if probe {
                    self.start_probe();
                }
                error
            }
        };
        Err(name_key(error))
    }
}
