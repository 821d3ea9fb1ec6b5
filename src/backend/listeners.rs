//! Reference-counted release listeners, shared by the built-in backends.
//!
//! Several local waiters (of several clients sharing one backend) can listen on one lock. Each
//! gets its own [`Listener`] with its own wake-up permit, so one notification wakes each of them
//! once and never gets consumed by the wrong one. A listener may be tagged with a holder id: it
//! then wakes only for notifications that name that holder (a fair lock's next holder). The
//! backend is told when a channel gains its first listener and loses its last, to subscribe and
//! unsubscribe.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::sync::{Notify, mpsc};

use super::store::Listen;

/// Each channel's listeners: id, tag, wake-up.
type Channels = HashMap<String, Vec<(u64, Option<String>, Arc<Notify>)>>;

/// The listeners of every channel, and where to report channels that lost their last listener.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    channels: Mutex<Channels>,
    /// How many channels have listeners: read by every release without the lock.
    listened: AtomicUsize,
    next_id: std::sync::atomic::AtomicU64,
    emptied: Option<mpsc::UnboundedSender<String>>,
}

impl Listeners {
    /// Listeners that report emptied channels to `emptied`.
    #[cfg(feature = "redis")]
    pub(crate) fn reporting_to(emptied: mpsc::UnboundedSender<String>) -> Self {
        Self { emptied: Some(emptied), ..Self::default() }
    }

    /// Adds a listener to `channel`, woken only by notifications naming `tag` when it has one.
    /// The flag tells whether it is the channel's first.
    pub(crate) fn add(self: &Arc<Self>, channel: String, tag: Option<&str>) -> (Listener, bool) {
        let id = self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let mut channels = self.lock();
        let entry = channels.entry(channel.clone()).or_default();
        let first = entry.is_empty();
        entry.push((id, tag.map(str::to_owned), notify.clone()));
        // SeqCst with the load in `is_empty`: a release that reads no channel here happened
        // before this listener existed, and the waiter's check after listening sees it.
        self.listened.store(channels.len(), Ordering::SeqCst);
        drop(channels);
        let listener = Listener { listeners: self.clone(), channel, id, notify };
        (listener, first)
    }

    /// Whether no channel has a listener.
    pub(crate) fn is_empty(&self) -> bool {
        self.listened.load(Ordering::SeqCst) == 0
    }

    /// Wakes the listeners of `channel` that `payload` concerns: untagged ones, and the one
    /// tagged with it. Returns how many listened on the channel.
    pub(crate) fn notify(&self, channel: &str, payload: &str) -> u64 {
        let channels = self.lock();
        let Some(entry) = channels.get(channel) else {
            return 0;
        };
        for (_, tag, notify) in entry {
            if tag.as_deref().is_none_or(|tag| tag == payload) {
                notify.notify_one();
            }
        }
        entry.len() as u64
    }

    /// Wakes every listener (after a reconnect, when messages may have been lost).
    #[cfg(feature = "redis")]
    pub(crate) fn notify_all(&self) {
        for entry in self.lock().values() {
            for (_, _, notify) in entry {
                notify.notify_one();
            }
        }
    }

    /// Wakes every listener of `channel`, whatever its tag (after its subscription was
    /// made or re-established, when messages may have been lost).
    #[cfg(feature = "redis")]
    pub(crate) fn notify_channel(&self, channel: &str) {
        for (_, _, notify) in self.lock().get(channel).into_iter().flatten() {
            notify.notify_one();
        }
    }

    /// Every channel that has listeners.
    #[cfg(feature = "redis")]
    pub(crate) fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Whether `channel` has listeners.
    #[cfg(feature = "redis")]
    pub(crate) fn is_listened(&self, channel: &str) -> bool {
        self.lock().contains_key(channel)
    }

    /// How many channels have listeners.
    #[cfg(feature = "redis")]
    pub(crate) fn channel_count(&self) -> usize {
        self.lock().len()
    }

    fn remove(&self, channel: &str, id: u64) {
        let mut channels = self.lock();
        let Some(entry) = channels.get_mut(channel) else {
            return;
        };
        entry.retain(|(other, _, _)| *other != id);
        if entry.is_empty() {
            channels.remove(channel);
            self.listened.store(channels.len(), Ordering::SeqCst);
            if let Some(emptied) = &self.emptied {
                // The receiver is gone only when the backend shut down; nothing to unsubscribe.
                let _ = emptied.send(channel.to_owned());
            }
        }
    }

    // A std mutex: held for map updates only, never across an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A registration for release notifications of one lock; dropping it unregisters.
#[derive(Debug)]
pub struct Listener {
    listeners: Arc<Listeners>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
}

impl Listen for Listener {
    fn notified(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.notify.notified()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.listeners.remove(&self.channel, self.id);
    }
}
