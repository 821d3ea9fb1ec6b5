//! The one pub/sub connection of a backend, shared by every waiter of every key.
//!
//! A task owns the connection. A channel's listeners ask it to subscribe and wait for Redis to
//! confirm; the last one leaving makes it unsubscribe. The task compares what is wanted with
//! what is subscribed rather than replaying requests, so racing requests end in the state the
//! listeners want. After a reconnect it subscribes again and wakes every listener (releases
//! published meanwhile are lost): each waiter checks its lock once more.

use std::{
    collections::HashSet,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::transport::Target;
use crate::backend::{Listener, Listeners};

/// How often the connection is pinged: a server gone away is not always noticed otherwise.
const PING_EVERY: Duration = Duration::from_secs(1);

/// A request to the task: make sure `channel` is subscribed, then answer.
pub(super) type Subscribe = (String, oneshot::Sender<()>);

/// The handle the backend keeps.
#[derive(Debug)]
pub(super) struct PubSub {
    listeners: Arc<Listeners>,
    requests: mpsc::UnboundedSender<Subscribe>,
    reconnects: Arc<AtomicU64>,
    connected: Arc<AtomicBool>,
    timeout: Duration,
}

/// What a notification task serves: the listeners, and the handle's requests.
pub(super) struct Feed {
    pub(super) listeners: Arc<Listeners>,
    /// Channels that gained their first listener, with whom to tell once subscribed.
    pub(super) requests: mpsc::UnboundedReceiver<Subscribe>,
    /// Channels that lost their last listener.
    pub(super) emptied: mpsc::UnboundedReceiver<String>,
    pub(super) reconnects: Arc<AtomicU64>,
    /// Set while the task's subscriptions are made: only then does a listener wait for its own.
    pub(super) connected: Arc<AtomicBool>,
}

impl PubSub {
    /// Starts the task on the current runtime; it stops when `stop` is cancelled.
    pub(super) fn start(target: Arc<Target>, timeout: Duration, stop: CancellationToken) -> Self {
        Self::spawn(timeout, false, |feed| Task { target, feed, timeout, stop }.run())
    }

    /// Spawns the task `serve` builds from the feed of a new handle. With `always_confirmed`,
    /// every listener waits for its subscription to be confirmed, connected or not.
    pub(super) fn spawn<F>(
        timeout: Duration,
        always_confirmed: bool,
        serve: impl FnOnce(Feed) -> F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (requests, request_rx) = mpsc::unbounded_channel();
        let (emptied, emptied_rx) = mpsc::unbounded_channel();
        let listeners = Arc::new(Listeners::reporting_to(emptied));
        let reconnects = Arc::new(AtomicU64::new(0));
        let connected = Arc::new(AtomicBool::new(always_confirmed));
        tokio::spawn(serve(Feed {
            listeners: listeners.clone(),
            requests: request_rx,
            emptied: emptied_rx,
            reconnects: reconnects.clone(),
            connected: connected.clone(),
        }));
        Self { listeners, requests, reconnects, connected, timeout }
    }

    /// Listens on `channel`: resolves once Redis confirmed the subscription, or at once while
    /// the connection is down (the reconnect subscribes and wakes the listener). Every
    /// listener waits, not only the first: its caller checks the lock counting on every
    /// release from then on reaching it, and the task answers in order.
    pub(super) async fn listen(&self, channel: String, only_for: Option<&str>) -> Listener {
        let (listener, confirmed) = self.subscribe(channel, only_for);
        confirmed.await;
        listener
    }

    /// [`listen`](Self::listen) in two halves: the listener, registered at once, and the wait
    /// for the confirmation (or the timeout), which tells whether Redis confirmed it.
    pub(super) fn subscribe(
        &self,
        channel: String,
        only_for: Option<&str>,
    ) -> (Listener, impl Future<Output = bool> + Send + 'static) {
        let (listener, _first) = self.listeners.add(channel.clone(), only_for);
        let (done, confirmed) = oneshot::channel();
        let sent = self.requests.send((channel, done)).is_ok();
        let connected = self.connected.load(Ordering::Acquire);
        let timeout = self.timeout;
        let confirmation = async move {
            sent && connected
                && matches!(tokio::time::timeout(timeout, confirmed).await, Ok(Ok(())))
        };
        (listener, confirmation)
    }

    /// How many channels have listeners.
    pub(super) fn channel_count(&self) -> usize {
        self.listeners.channel_count()
    }

    /// How many times the connection was re-established.
    pub(super) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }
}

struct Task {
    target: Arc<Target>,
    feed: Feed,
    timeout: Duration,
    stop: CancellationToken,
}

impl Task {
    async fn run(mut self) {
        let (target, stop, timeout) = (self.target.clone(), self.stop.clone(), self.timeout);
        let server = target.describe();
        let mut connected_before = false;
        // After a failover the target names the new master.
        let connect = || async {
            let pubsub = async { target.client().await?.get_async_pubsub().await };
            match tokio::time::timeout(timeout, pubsub).await {
                Ok(result) => result.map_err(|error| error.to_string()),
                Err(_) => Err("timed out".to_owned()),
            }
        };
        while let Some(pubsub) = connect_until(&stop, connect).await {
            if connected_before {
                self.feed.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%server, "release notification connection re-established");
            }
            connected_before = true;
            let (sink, stream) = pubsub.split();
            let ended = self.serve(sink, stream).await;
            self.feed.connected.store(false, Ordering::Release);
            let Some(cause) = ended else { return };
            // Not a warning: an outage is reported once by the commands' health.
            tracing::info!(%server, cause, "release notification connection lost; reconnecting");
        }
    }

    /// Serves one connection until it breaks (returning why) or the backend stops (`None`).
    async fn serve(
        &mut self,
        mut sink: PubSubSink,
        mut stream: PubSubStream,
    ) -> Option<&'static str> {
        let mut subscribed = HashSet::new();
        for channel in self.feed.listeners.channels() {
            if !self.reconcile(&mut sink, &mut subscribed, channel).await {
                return Some("a subscription failed");
            }
        }
        self.feed.connected.store(true, Ordering::Release);
        self.feed.listeners.notify_all();
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return None,
                _ = ping.tick() => {
                    let pong = tokio::time::timeout(self.timeout, sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return Some("the server did not answer a ping");
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else {
                        return Some("the server closed the connection");
                    };
                    let payload: String = message.get_payload().unwrap_or_default();
                    self.feed.listeners.notify(message.get_channel_name(), &payload);
                }
                Some((channel, done)) = self.feed.requests.recv() => {
                    if !self.reconcile(&mut sink, &mut subscribed, channel.clone()).await {
                        return Some("a subscription failed");
                    }
                    if done.send(()).is_err() {
                        // Its caller did not wait: it checks once more.
                        self.feed.listeners.notify_channel(&channel);
                    }
                }
                Some(channel) = self.feed.emptied.recv() => {
                    if !self.reconcile(&mut sink, &mut subscribed, channel).await {
                        return Some("an unsubscription failed");
                    }
                }
            }
        }
    }

    /// Subscribes or unsubscribes `channel` so the connection matches the listeners; false
    /// when the connection failed.
    async fn reconcile(
        &self,
        sink: &mut PubSubSink,
        subscribed: &mut HashSet<String>,
        channel: String,
    ) -> bool {
        let wanted = self.feed.listeners.is_listened(&channel);
        let result = if wanted && !subscribed.contains(&channel) {
            let result = tokio::time::timeout(self.timeout, sink.subscribe(&channel)).await;
            subscribed.insert(channel);
            result
        } else if !wanted && subscribed.remove(&channel) {
            tokio::time::timeout(self.timeout, sink.unsubscribe(&channel)).await
        } else {
            return true;
        };
        if let Ok(Err(error)) = &result {
            tracing::debug!(server = %self.target.describe(), error = %format_args!("{error:#}"), "subscription change failed");
        }
        matches!(result, Ok(Ok(())))
    }
}

/// Calls `connect` until it succeeds, backing off from 20 ms to 1 s, or `stop` is cancelled.
pub(super) async fn connect_until<T, E: std::fmt::Display, F>(
    stop: &CancellationToken,
    mut connect: impl FnMut() -> F,
) -> Option<T>
where
    F: Future<Output = Result<T, E>>,
{
    let attempts = async {
        let mut backoff = Duration::from_millis(20);
        loop {
            match connect().await {
                Ok(connected) => return connected,
                Err(error) => tracing::debug!(%error, "release notification connection failed"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    };
    tokio::select! {
        () = stop.cancelled() => None,
        connected = attempts => Some(connected),
    }
}
