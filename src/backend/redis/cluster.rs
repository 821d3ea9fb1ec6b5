//! The Redis Cluster transport: one redis-rs cluster connection for commands, and the
//! configuration of the sharded pub/sub connection opened on the first wait.
//!
//! Every key of one lock carries the lock's hash tag, so each script call touches one slot and
//! the cluster connection routes it to the slot's master by its first key, following `MOVED`
//! and `ASK` while slots migrate or a replica takes over. Both connections use RESP3: the pub/sub
//! one because redis-rs needs it for sharded subscriptions, the command one because over RESP3
//! a node connection that drops is noticed (and repaired) at once rather than by the next
//! command sent into it. The scripts' replies (arrays of integers, integers) read the same.

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
    ///
    /// # Errors
    /// [`BackendErrorKind::Unavailable`] for an invalid URL; the mapped redis-rs error when no
    /// node answers.
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

/// The settings both connections share: each node connection and each reply within the
/// command timeout (the backend also bounds every whole call by it), and a retry budget that
/// runs out well within it. redis-rs retries a command while its slot's master cannot be
/// reached (a failover in progress, nodes still disagreeing on the new master); its defaults
/// wait over a second before the first retry and retry for minutes, so a call would only ever
/// end in the backend's timeout. With this budget the call ends in time with the error that
/// says why (connection refused, `MOVED`, `CLUSTERDOWN`), which the engine treats as a backend
/// that is briefly unavailable and tries again while the caller's wait lasts.
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

/// How many times redis-rs retries one command (redirects included: a migration needs one or
/// two). Each wait is at most a tenth of the command timeout, so all of them take half of it.
const RETRIES: u32 = 5;
/// The shortest wait before redis-rs retries a command, in milliseconds.
const RETRY_MIN_MS: u64 = 10;
/// The first retry's wait, doubling with each retry, in milliseconds.
const RETRY_FACTOR_MS: u64 = 20;
