//! The one pub/sub connection of a backend, shared by every waiter of every key.
//!
//! A task owns the connection. Waiters register a [`Listener`] per key; the first listener of a
//! channel asks the task to subscribe and waits for Redis to confirm, the last one leaving makes
//! the task unsubscribe. The task compares what is wanted with what is subscribed rather than
//! replaying requests, so a subscribe and an unsubscribe of the same channel racing each other
//! always end in the state the listeners want. After a reconnect it subscribes every wanted
//! channel again and wakes every listener, since releases published while it was away are lost:
//! each waiter then checks the lock once more.

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

use super::target::Target;
use crate::backend::{Listener, Listeners};

/// How often the connection is pinged to find out that its server went away.
const PING_EVERY: Duration = Duration::from_secs(1);

/// A request to the task: make sure `channel` is subscribed, then answer.
pub(super) type Subscribe = (String, oneshot::Sender<()>);

/// The handle the backend keeps.
#[derive(Debug)]
pub(super) struct PubSub {
    listeners: Arc<Listeners>,
    requests: mpsc::UnboundedSender<Subscribe>,
    reconnects: Arc<AtomicU64>,
    /// Whether the task has a connection now (its subscriptions made).
    connected: Arc<AtomicBool>,
    timeout: Duration,
}

/// What a notification task serves: the listeners, and the handle's requests.
pub(super) struct Feed {
    /// Every listener of every channel.
    pub(super) listeners: Arc<Listeners>,
    /// Channels that gained their first listener, with whom to tell once subscribed.
    pub(super) requests: mpsc::UnboundedReceiver<Subscribe>,
    /// Channels that lost their last listener.
    pub(super) emptied: mpsc::UnboundedReceiver<String>,
    /// Counts re-established connections.
    pub(super) reconnects: Arc<AtomicU64>,
    /// Set while the task has a connection whose subscriptions are made: a listener then
    /// waits for its subscription to be confirmed; otherwise it need not (see
    /// [`PubSub::subscribe`]).
    pub(super) connected: Arc<AtomicBool>,
}

impl PubSub {
    /// Starts the task on the current runtime. It stops when `stop` is cancelled.
    pub(super) fn start(target: Arc<Target>, timeout: Duration, stop: CancellationToken) -> Self {
        Self::spawn(timeout, false, |feed| {
            Task {
                target,
                listeners: feed.listeners,
                requests: feed.requests,
                emptied: feed.emptied,
                reconnects: feed.reconnects,
                connected: feed.connected,
                timeout,
                stop,
            }
            .run()
        })
    }

    /// Spawns the task that `serve` builds from the feed of a new handle: the handle's side
    /// (listening, counters) is the same whatever connection the task keeps. With
    /// `always_confirmed`, every listener waits for its subscription to be confirmed, whatever
    /// the task says of its connection.
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
        Self {
            listeners,
            requests,
            reconnects,
            connected,
            timeout,
        }
    }

    /// Listens on `channel`. Resolves once Redis confirmed the subscription, or after the
    /// timeout when the connection is down (the reconnect will subscribe and wake the listener).
    /// Every listener waits for the confirmation, not only the channel's first: a later one
    /// may come while the first's subscribe is still on its way, and its caller checks the
    /// lock again counting on releases reaching it from then on. The task answers in order, so
    /// the answer comes after that subscribe's.
    pub(super) async fn listen(&self, channel: String, only_for: Option<&str>) -> Listener {
        let (listener, confirmed) = self.subscribe(channel, only_for);
        confirmed.await;
        listener
    }

    /// [`listen`](Self::listen) in two halves: the listener, registered at once, and the wait
    /// for Redis to confirm the subscription (or for the timeout), which tells whether it did.
    ///
    /// While the connection is down there is nothing to wait for: the listener is registered,
    /// the task subscribes it once connected and then wakes it (as every listener after a
    /// reconnect), so its caller checks the lock again then. Waiting instead would hold the
    /// caller (and the local waiters queued behind it) for the whole reconnect.
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
    listeners: Arc<Listeners>,
    requests: mpsc::UnboundedReceiver<Subscribe>,
    emptied: mpsc::UnboundedReceiver<String>,
    reconnects: Arc<AtomicU64>,
    connected: Arc<AtomicBool>,
    timeout: Duration,
    stop: CancellationToken,
}

/// Why a connection ended.
enum Ended {
    Stopped,
    /// The connection failed, for this reason.
    Broken(&'static str),
}

impl Task {
    async fn run(mut self) {
        let mut backoff = Duration::from_millis(20);
        let mut connected_before = false;
        loop {
            // After a failover the target names the new master.
            let connect = tokio::time::timeout(self.timeout, async {
                self.target.client().await?.get_async_pubsub().await
            });
            let pubsub = tokio::select! {
                () = self.stop.cancelled() => return,
                result = connect => result,
            };
            match pubsub {
                Ok(Ok(pubsub)) => {
                    backoff = Duration::from_millis(20);
                    if connected_before {
                        self.reconnects.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(server = %self.target.describe(), "release notification connection re-established");
                    }
                    connected_before = true;
                    let (sink, stream) = pubsub.split();
                    let ended = self.serve(sink, stream).await;
                    self.connected.store(false, Ordering::Release);
                    let Ended::Broken(cause) = ended else {
                        return;
                    };
                    // Information, not a warning: a server that is gone is reported once by
                    // the commands' health; waiters check their locks again on reconnect.
                    tracing::info!(server = %self.target.describe(), cause, "release notification connection lost; reconnecting");
                }
                Ok(Err(error)) => {
                    tracing::debug!(server = %self.target.describe(), error = %format_args!("{error:#}"), "release notification connection failed");
                }
                Err(_) => {
                    tracing::debug!(server = %self.target.describe(), timeout = ?self.timeout, "release notification connection timed out")
                }
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Serves one connection until it breaks or the backend stops.
    async fn serve(&mut self, mut sink: PubSubSink, mut stream: PubSubStream) -> Ended {
        let mut subscribed = HashSet::new();
        for channel in self.listeners.channels() {
            if !self.reconcile(&mut sink, &mut subscribed, channel).await {
                return Ended::Broken("a subscription failed");
            }
        }
        // Releases published while disconnected are lost: every waiter checks again.
        self.connected.store(true, Ordering::Release);
        self.listeners.notify_all();
        // A connection whose server went away is not always closed on this side until
        // something is written to it: a ping finds out, so waiters hear of the outage (and
        // check their locks again on reconnect) within a ping's interval.
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return Ended::Stopped,
                _ = ping.tick() => {
                    let pong = tokio::time::timeout(self.timeout, sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return Ended::Broken("the server did not answer a ping");
                    }
                }
                message = stream.next() => match message {
                    Some(message) => {
                        let payload: String = message.get_payload().unwrap_or_default();
                        self.listeners.notify(message.get_channel_name(), &payload);
                    }
                    None => return Ended::Broken("the server closed the connection"),
                },
                Some((channel, done)) = self.requests.recv() => {
                    let ok = self.reconcile(&mut sink, &mut subscribed, channel.clone()).await;
                    if ok && done.send(()).is_err() {
                        // Its caller did not wait (the connection was down when it asked, or
                        // it gave up): releases reach it from now on, so it checks once more.
                        self.listeners.notify_channel(&channel);
                    }
                    if !ok {
                        return Ended::Broken("a subscription failed");
                    }
                }
                Some(channel) = self.emptied.recv() => {
                    if !self.reconcile(&mut sink, &mut subscribed, channel).await {
                        return Ended::Broken("an unsubscription failed");
                    }
                }
            }
        }
    }

    /// Subscribes or unsubscribes `channel` so the connection matches the listeners. Returns
    /// false when the connection failed.
    async fn reconcile(
        &self,
        sink: &mut PubSubSink,
        subscribed: &mut HashSet<String>,
        channel: String,
    ) -> bool {
        let wanted = self.listeners.is_listened(&channel);
        let result = if wanted && !subscribed.contains(&channel) {
            let result = tokio::time::timeout(self.timeout, sink.subscribe(&channel)).await;
            subscribed.insert(channel);
            result
        } else if !wanted && subscribed.remove(&channel) {
            tokio::time::timeout(self.timeout, sink.unsubscribe(&channel)).await
        } else {
            return true;
        };
        match result {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                tracing::debug!(server = %self.target.describe(), error = %format_args!("{error:#}"), "subscription change failed");
                false
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second listener of a channel whose subscribe is still on its way does not resolve
    /// before Redis confirmed it: its caller checks the lock again counting on every release
    /// from then on reaching it.
    #[tokio::test]
    async fn every_listener_waits_for_the_subscription() {
        let (confirm, confirmed) = oneshot::channel::<()>();
        let pubsub = Arc::new(PubSub::spawn(
            Duration::from_secs(5),
            true,
            |mut feed| async move {
                // Holds every request until the test lets the subscription be confirmed.
                let mut waiting = Vec::new();
                let mut confirmed = confirmed;
                loop {
                    tokio::select! {
                        Some((_, done)) = feed.requests.recv() => waiting.push(done),
                        _ = &mut confirmed => break,
                    }
                }
                for done in waiting {
                    let _ = done.send(());
                }
                // Subscribed from now on: every request is answered at once.
                while let Some((_, done)) = feed.requests.recv().await {
                    let _ = done.send(());
                }
            },
        ));
        let first = tokio::spawn({
            let pubsub = pubsub.clone();
            async move { pubsub.listen("lock:released".to_owned(), None).await }
        });
        while pubsub.channel_count() == 0 {
            tokio::task::yield_now().await;
        }
        let second = tokio::time::timeout(
            Duration::from_millis(50),
            pubsub.listen("lock:released".to_owned(), None),
        )
        .await;
        assert!(
            second.is_err(),
            "the second listener did not wait for the subscription"
        );
        confirm.send(()).unwrap();
        let _first = first.await.unwrap();
        let third = tokio::time::timeout(
            Duration::from_secs(1),
            pubsub.listen("lock:released".to_owned(), None),
        )
        .await;
        assert!(third.is_ok(), "a confirmed subscription answers at once");
    }

    /// While the task has no connection, a listener does not wait for a subscription that
    /// cannot be confirmed before the reconnect: it is registered, and the reconnect wakes it.
    #[tokio::test]
    async fn a_listener_does_not_wait_while_disconnected() {
        let (requests_seen, mut seen) = mpsc::unbounded_channel();
        let pubsub = PubSub::spawn(Duration::from_secs(5), false, |mut feed| async move {
            // Never connects: requests are kept, never answered.
            let mut kept = Vec::new();
            while let Some(request) = feed.requests.recv().await {
                let _ = requests_seen.send(());
                kept.push(request);
            }
        });
        let listener = tokio::time::timeout(
            Duration::from_secs(1),
            pubsub.listen("lock:released".to_owned(), None),
        )
        .await;
        assert!(
            listener.is_ok(),
            "the listener waited for a connection that is down"
        );
        seen.recv()
            .await
            .expect("the subscription is still asked for");
        assert_eq!(pubsub.channel_count(), 1, "the listener is registered");
    }
}
