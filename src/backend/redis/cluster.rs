//! The Redis Cluster transport: one redis-rs cluster connection for commands, and one for
//! sharded pub/sub, opened on the first wait.
//!
//! Every key of one lock carries its hash tag, so each script call touches one slot and goes to
//! its master by its first key, following `MOVED` and `ASK`. Both connections use RESP3: the
//! pub/sub one for sharded subscriptions, the command one because over RESP3 a node connection
//! that drops is noticed at once rather than by the next command sent into it.
//!
//! Release notifications use `SSUBSCRIBE` on the shard that owns each lock's slot, where its
//! `SPUBLISH` goes; messages, subscription changes and disconnections come as pushes, and the
//! task serves the same [`Feed`] as the single-node one. When a node connection drops, or the
//! server drops a wanted channel (its slot moved), the channel is subscribed again, retried
//! until its slot has a reachable master, and only then are its listeners woken (releases
//! published meanwhile are lost), so that they do not check their lock on a node still down.

use std::{collections::HashSet, sync::atomic::Ordering, time::Duration};

use futures_util::future::join_all;
use redis::{
    ConnectionInfo, ErrorKind, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisError,
    Value,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    pubsub::{Feed, PubSub, connect_until},
    redis_error,
};
use crate::error::{BackendError, BackendErrorKind};

/// A connected cluster.
pub(super) struct Cluster {
    /// The command connection.
    pub(super) conn: ClusterConnection,
    pub(super) nodes: Vec<ConnectionInfo>,
}

impl Cluster {
    /// Connects to the cluster that `nodes` (one or more of its nodes) belong to.
    pub(super) async fn connect(nodes: &[String], timeout: Duration) -> Result<Self, BackendError> {
        let unavailable = |e: RedisError| BackendError::new(BackendErrorKind::Unavailable, e);
        let nodes = (nodes.iter())
            .map(|url| url.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        if nodes.is_empty() {
            return Err(unavailable(
                (ErrorKind::InvalidClientConfig, "no cluster node given").into(),
            ));
        }
        let client = builder(&nodes, timeout).build().map_err(unavailable)?;
        let conn = connect(&client, timeout).await?;
        Ok(Self { conn, nodes })
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

/// The settings both connections share: RESP3, each node connection and reply within the
/// command timeout, and a retry budget well within it. redis-rs retries a command while its slot's
/// master cannot be reached; its defaults retry for minutes, so a call would only end in the
/// backend's timeout. With this budget it ends in time with the error that says why, which the
/// engine takes as a store briefly unavailable.
fn builder(nodes: &[ConnectionInfo], timeout: Duration) -> ClusterClientBuilder {
    let max_wait = u64::try_from((timeout / (RETRIES * 2)).as_millis())
        .unwrap_or(u64::MAX)
        .max(RETRY_MIN_MS + 1);
    ClusterClientBuilder::new(nodes.to_vec())
        .use_protocol(ProtocolVersion::RESP3)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(RETRIES)
        .min_retry_wait(RETRY_MIN_MS)
        .max_retry_wait(max_wait)
        .retry_wait_formula(RETRY_FACTOR_MS, 2)
}

/// How many times redis-rs retries one command (redirects included), each wait at most a tenth
/// of the command timeout, the first [`RETRY_FACTOR_MS`], doubling, at least [`RETRY_MIN_MS`].
const RETRIES: u32 = 5;
const RETRY_MIN_MS: u64 = 10;
const RETRY_FACTOR_MS: u64 = 20;

/// The first delay before retrying failed subscriptions; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(20);
/// The longest delay between retries, small so a promoted replica is found soon.
const MAX_RETRY: Duration = Duration::from_millis(250);

/// Starts the sharded notification task for `cluster`; it stops when `stop` is cancelled.
pub(super) fn start_pubsub(
    cluster: &Cluster,
    timeout: Duration,
    stop: CancellationToken,
) -> PubSub {
    // A client whose node connections push messages, subscription changes, disconnections.
    let (pushes_tx, pushes) = mpsc::unbounded_channel();
    let client = builder(&cluster.nodes, timeout).push_sender(pushes_tx).build();
    // Each channel is subscribed (or retried) on its own shard: a listener always waits.
    PubSub::spawn(timeout, true, move |feed| async move {
        let client = match client {
            Ok(client) => client,
            Err(error) => {
                return tracing::error!(%error, "release notifications cannot be configured");
            }
        };
        let Some(conn) = connect_until(&stop, || connect(&client, timeout)).await else {
            return;
        };
        Task {
            conn,
            feed,
            pushes,
            timeout,
            subscribed: HashSet::new(),
            stale: HashSet::new(),
            retry: FIRST_RETRY,
            retry_at: Instant::now(),
        }
        .serve(stop)
        .await;
    })
}

struct Task {
    conn: ClusterConnection,
    feed: Feed,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    timeout: Duration,
    /// Channels asked for and not given up.
    subscribed: HashSet<String>,
    /// Subscribed channels to subscribe again (their node went away, or the server dropped
    /// them), at `retry_at`.
    stale: HashSet<String>,
    retry: Duration,
    retry_at: Instant,
}

impl Task {
    async fn serve(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Some(push) = self.pushes.recv() => self.on_push(push),
                Some((channel, done)) = self.feed.requests.recv() => {
                    self.reconcile(channel).await;
                    let _ = done.send(());
                }
                Some(channel) = self.feed.emptied.recv() => self.reconcile(channel).await,
                () = tokio::time::sleep_until(self.retry_at), if !self.stale.is_empty() => {
                    self.resubscribe().await;
                }
            }
        }
    }

    fn on_push(&mut self, push: PushInfo) {
        match push.kind {
            PushKind::SMessage => {
                if let [channel, payload, ..] = push.data.as_slice() {
                    self.feed.listeners.notify(&text(channel), &text(payload));
                }
            }
            PushKind::Disconnection => {
                self.feed.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("a release notification node connection dropped; resubscribing");
                // Which channels that node served is not known here: renew them all.
                self.stale.extend(self.subscribed.iter().cloned());
                self.retry_soon();
            }
            PushKind::SUnsubscribe => {
                let Some(channel) = push.data.first().map(text) else {
                    return;
                };
                // Our own unsubscribes forget the channel first: this one came from the server.
                if self.subscribed.contains(&channel) {
                    tracing::info!(channel, "release channel dropped by its node; resubscribing");
                    self.stale.insert(channel);
                    self.retry_soon();
                }
            }
            _ => {}
        }
    }

    /// Subscribes or unsubscribes `channel` so the connection matches the listeners; a failed
    /// subscribe is retried in the background.
    async fn reconcile(&mut self, channel: String) {
        let wanted = self.feed.listeners.is_listened(&channel);
        if wanted && !self.subscribed.contains(&channel) {
            self.subscribed.insert(channel.clone());
            if !self.ssubscribe(&channel).await {
                self.stale.insert(channel);
                self.retry_soon();
            }
        } else if !wanted && self.subscribed.remove(&channel) {
            self.stale.remove(&channel);
            // A node gone or slow drops the channel with its connection; a message on it finds
            // no listener.
            let mut conn = self.conn.clone();
            let _ = tokio::time::timeout(self.timeout, conn.sunsubscribe(&channel)).await;
        }
    }

    /// Subscribes every stale channel again, waking the listeners of those that came back.
    async fn resubscribe(&mut self) {
        let channels: Vec<String> =
            self.stale.drain().filter(|channel| self.subscribed.contains(channel)).collect();
        let results = join_all(channels.iter().map(|channel| self.ssubscribe(channel))).await;
        for (channel, ok) in channels.into_iter().zip(results) {
            if ok {
                // Releases published while it was away are lost: its waiters check again.
                self.feed.listeners.notify_channel(&channel);
            } else {
                self.stale.insert(channel);
            }
        }
        if self.stale.is_empty() {
            self.retry = FIRST_RETRY;
        } else {
            self.retry_at = Instant::now() + self.retry;
            self.retry = (self.retry * 2).min(MAX_RETRY);
        }
    }

    async fn ssubscribe(&self, channel: &str) -> bool {
        let mut conn = self.conn.clone();
        let result = tokio::time::timeout(self.timeout, conn.ssubscribe(channel)).await;
        if !matches!(result, Ok(Ok(()))) {
            tracing::debug!(channel, ?result, "sharded subscribe failed");
        }
        matches!(result, Ok(Ok(())))
    }

    fn retry_soon(&mut self) {
        self.retry_at = Instant::now() + FIRST_RETRY;
    }
}

/// A push item as text (channel names and payloads are ASCII).
fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        _ => String::new(),
    }
}
