//! The Redis Cluster transport: one redis-rs cluster connection for commands, and the
//! configuration of the sharded pub/sub connection opened on the first wait.
//!
//! Every key of one lock carries its hash tag, so each script call touches one slot and goes to
//! its master by its first key, following `MOVED` and `ASK`. Both connections use RESP3: the
//! pub/sub one for sharded subscriptions, the command one because over RESP3 a node connection
//! that drops is noticed at once rather than by the next command sent into it.

use std::time::Duration;

use redis::{
    ConnectionInfo, IntoConnectionInfo, ProtocolVersion, PushInfo,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
};
use tokio::sync::mpsc;

use super::redis_error;
use crate::error::{BackendError, BackendErrorKind};

/// A connected cluster.
pub(super) struct Cluster {
    conn: ClusterConnection,
    nodes: Vec<ConnectionInfo>,
    timeout: Duration,
}

impl Cluster {
    /// Connects to the cluster that `nodes` (one or more of its nodes) belong to.
    pub(super) async fn connect(nodes: &[String], timeout: Duration) -> Result<Self, BackendError> {
        let nodes = nodes
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BackendError::new(BackendErrorKind::Unavailable, e))?;
        if nodes.is_empty() {
            return Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "no cluster node given",
            ));
        }
        let client = builder(&nodes, timeout)
            .use_protocol(ProtocolVersion::RESP3)
            .build()
            .map_err(|e| BackendError::new(BackendErrorKind::Unavailable, e))?;
        let conn = connect(&client, timeout).await?;
        Ok(Self {
            conn,
            nodes,
            timeout,
        })
    }

    /// A handle on the command connection.
    pub(super) fn connection(&self) -> ClusterConnection {
        self.conn.clone()
    }

    /// The configured nodes' addresses, for `Debug` (never their passwords).
    pub(super) fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| node.addr().to_string())
            .collect()
    }

    /// A RESP3 client whose node connections deliver pushes (sharded messages, subscription
    /// changes, disconnections) to `pushes`.
    pub(super) fn pubsub_client(
        &self,
        pushes: mpsc::UnboundedSender<PushInfo>,
    ) -> Result<ClusterClient, BackendError> {
        builder(&self.nodes, self.timeout)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(pushes)
            .build()
            .map_err(|e| BackendError::new(BackendErrorKind::Unavailable, e))
    }
}

/// Connects `client` within `timeout`.
pub(super) async fn connect(
    client: &ClusterClient,
    timeout: Duration,
) -> Result<ClusterConnection, BackendError> {
    match tokio::time::timeout(timeout, client.get_async_connection()).await {
        Ok(result) => result.map_err(redis_error),
        Err(_) => Err(BackendError::from_kind(BackendErrorKind::Timeout)),
    }
}

/// The settings both connections share: each node connection and reply within the command
/// timeout, and a retry budget well within it. redis-rs retries a command while its slot's
/// master cannot be reached; its defaults retry for minutes, so a call would only end in the
/// backend's timeout. With this budget it ends in time with the error that says why, which the
/// engine takes as a store briefly unavailable.
fn builder(nodes: &[ConnectionInfo], timeout: Duration) -> ClusterClientBuilder {
    let max_wait = u64::try_from((timeout / (RETRIES * 2)).as_millis())
        .unwrap_or(u64::MAX)
        .max(RETRY_MIN_MS + 1);
    ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(RETRIES)
        .min_retry_wait(RETRY_MIN_MS)
        .max_retry_wait(max_wait)
        .retry_wait_formula(RETRY_FACTOR_MS, 2)
}

/// How many times redis-rs retries one command (redirects included). Each wait is at most a
/// tenth of the command timeout.
const RETRIES: u32 = 5;
/// The shortest wait before redis-rs retries a command, in milliseconds.
const RETRY_MIN_MS: u64 = 10;
/// The first retry's wait, doubling with each retry, in milliseconds.
const RETRY_FACTOR_MS: u64 = 20;
